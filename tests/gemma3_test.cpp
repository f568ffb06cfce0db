// Gemma 3 270M (GGUF Q4_K_M, fetched by `scripts/fetch-models.sh gemma3`; the tests skip without it): the config
// read from the metadata, logits against the NumPy forward pass of tests/reference/gemma3_reference.py (through the
// fp32 store and through an f32 KVCache), and token ids against the Hugging Face `tokenizers` package.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "kvq/detail/gguf.hpp"
#include "kvq/model.hpp"
#include "reference_logits.hpp"
#include "test_data.hpp"

namespace kvq {
namespace {

const char* const kFetchGemma = "run scripts/fetch-models.sh gemma3";

// From `python3 tests/reference/gemma3_reference.py`: BOS and the first tokens of its TEXT, and per position the
// argmax, the logit range and the logits at kProbeIds.
const std::vector<int> kIds = {2, 14946, 3324, 496, 990, 236764, 993, 691};
const std::vector<int> kProbeIds = {0,    1,     2,     3,     107,    496,    691,   990,
                                    993,  1000,  3324,  10000, 14946,  100000, 236764, 262143};
using test::ReferencePosition;
// clang-format off
const std::vector<ReferencePosition> kReference = {
    {184, 14.5218, -14.8610, {-11.9834, 5.8293, -0.7566, -11.9599, 12.9831, 7.7027, 4.7283, 3.1700, 4.4729, -1.0447, 0.3074, -2.4059, 7.0890, -5.3326, 10.0180, -11.9943}},
    {611, 22.9896, -16.5312, {-14.0083, 8.5655, -2.9062, -13.9650, 16.5746, 21.9992, 16.1128, 13.3496, 19.7543, 3.5199, 22.2223, 2.9301, 4.1104, 3.2706, 20.2227, -14.0459}},
    {496, 23.8409, -24.4388, {-22.3947, 9.9594, 1.0089, -22.3795, 15.3881, 23.8409, 10.1397, 19.0226, 9.3242, 2.3933, 9.5818, -0.0590, 2.9714, -3.5261, 16.8632, -22.4103}},
    {990, 23.5047, -22.7857, {-20.0883, 8.9510, -1.3347, -20.1260, 16.8846, 15.6624, 9.6573, 23.5047, 11.0303, 1.0110, 9.6941, 1.7772, 1.8234, -1.3278, 13.8214, -20.0989}},
    {236764, 22.9009, -24.9673, {-22.9066, 10.0506, -4.7186, -22.8799, 18.9534, 19.2609, 16.7485, 10.9050, 20.6977, 0.3576, 14.9801, 0.2071, 3.6917, -2.0223, 22.9009, -22.8594}},
    {993, 24.0207, -17.7343, {-15.5846, 11.0013, -4.6124, -15.5711, 19.3920, 23.5753, 18.4991, 16.1460, 24.0207, 6.3124, 17.6178, 3.9171, 5.6932, 0.3785, 3.3968, -15.5531}},
    {691, 29.4076, -20.8005, {-18.2657, 14.5550, -4.3953, -18.1592, 20.5413, 19.1918, 29.4076, 13.3161, 17.9689, 7.9269, 15.0625, 1.0602, 14.5035, 2.3076, 19.9441, -18.2131}},
    {496, 27.7692, -19.7182, {-16.4269, 14.7473, 0.0243, -16.4357, 20.0371, 27.7692, 16.7897, 19.3720, 18.1063, 5.2689, 13.1375, 6.5601, 9.5982, 2.0898, 21.0017, -16.4230}},
};
// clang-format on

struct TokenizerCase {
  std::string text;
  std::vector<int> ids;
};
// The same script's TOKENIZER_STRINGS and their ids.
// clang-format off
const std::vector<TokenizerCase> kHuggingFaceCases = {
    {"Hello world",
     {9259, 1902}},
    {"  leading spaces and trailing   ",
     {138, 26016, 9952, 532, 45330, 139}},
    {"Numbers: 3.14159, 2024-06-01 and 1,000,000!",
     {37091, 236787, 236743, 236800, 236761, 236770, 236812, 236770, 236810, 236819, 236764, 236743, 236778, 236771, 236778, 236812, 236772, 236771, 236825, 236772, 236771, 236770, 532, 236743, 236770, 236764, 236771, 236771, 236771, 236764, 236771, 236771, 236771, 236888}},
    {"It's we're they've I'm you'll he'd",
     {1509, 236789, 236751, 692, 236789, 500, 901, 236789, 560, 564, 236789, 236757, 611, 236789, 859, 668, 236789, 236753}},
    {"Punctuation... (brackets) [x] {y} <z> \"quotes\" 'single' @#$%^&*",
     {236791, 23733, 3145, 1390, 568, 212439, 236768, 870, 236781, 236842, 642, 236762, 236783, 655, 236802, 236813, 623, 52231, 236775, 756, 18999, 236789, 1392, 190494, 236884, 202079}},
    {"Tabs\tand\nnewlines\n\nand\r\nCRLF\t\t\tthree tabs",
     {76222, 255968, 624, 107, 208697, 108, 624, 251, 107, 6459, 43102, 255970, 19891, 42364}},
    {"Ünïcödé: naïve café, Straße, Ελληνικά, русский, 日本語のテキスト, 한국어",
     {238194, 236749, 238527, 236755, 55515, 236859, 236787, 120362, 33443, 236764, 80176, 236764, 23883, 109959, 42220, 236764, 170362, 236764, 33375, 238582, 236945, 95830, 236764, 50413, 237430}},
    {"Emoji 🙂🚀 and flags 🇫🇷 and a family 👨‍👩‍👧",
     {127268, 57235, 242015, 532, 22680, 236743, 246598, 242644, 532, 496, 2523, 236743, 243874, 237243, 243767, 237243, 244814}},
    {"Arabic digits ٣٤٥ and fullwidth １２３",
     {101293, 26798, 223766, 242090, 242323, 532, 2587, 2690, 236743, 238254, 238540, 238995}},
    {"<start_of_turn>user\nHi there<end_of_turn>\n<b>bold</b>",
     {105, 2364, 107, 10979, 993, 106, 107, 200, 15640, 209}},
    {"Rare bytes: \x01""\x7f"" and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ꙮ",
     {128280, 17234, 236787, 236743, 249732, 251541, 532, 236743, 478, 395, 386, 390, 478, 395, 386, 409, 254865, 478, 395, 386, 398, 255458, 478, 395, 386, 399, 478, 395, 386, 400, 236743, 472, 391, 412}},
};
// clang-format on

class Gemma3 : public testing::Test {
 protected:
  void SetUp() override { KVQ_REQUIRE_FILE(test::gemma3_path(), kFetchGemma); }
};

TEST_F(Gemma3, ConfigFromTheMetadata) {
  const LlamaModel m = LlamaModel::load(test::gemma3_path());
  const LlamaConfig& c = m.config();
  EXPECT_EQ(c.dim, 640);
  EXPECT_EQ(c.n_layers, 18);
  EXPECT_EQ(c.n_heads, 4);
  EXPECT_EQ(c.n_kv_heads, 1);
  EXPECT_EQ(c.head_dim(), 256);
  EXPECT_EQ(c.q_dim(), 1024);
  EXPECT_EQ(c.vocab_size, 262144);
  EXPECT_EQ(c.rope_style, RopeStyle::halves);
  EXPECT_EQ(c.activation, Activation::gelu_tanh);
  for (int l = 0; l < c.n_layers; ++l) {
    const bool global = l % 6 == 5;
    EXPECT_EQ(c.window(l), global ? 0 : 512) << "layer " << l;
    EXPECT_EQ(c.rope_base(l), global ? 1e6f : 1e4f) << "layer " << l;
  }
  EXPECT_NE(m.weights().layers[0].q_norm, nullptr);
  EXPECT_NE(m.weights().layers[0].post_ffn_norm, nullptr);
  EXPECT_EQ(m.weights().layers[0].bq, nullptr);
  EXPECT_EQ(m.weights().classifier.data, m.weights().token_embedding.data);
}


TEST_F(Gemma3, LogitsMatchTheNumpyReference) {
  const LlamaModel m = LlamaModel::load(test::gemma3_path());
  const auto tok = load_tokenizer(m, "");
  EXPECT_TRUE(tok->add_bos());
  std::vector<int> ids = {tok->bos()};
  for (int id : tok->encode("Once upon a time, there was a little robot")) ids.push_back(id);
  ids.resize(kIds.size());
  EXPECT_EQ(ids, kIds);
  LlamaRunner fp32(m, 8, 2);
  fp32.set_product_input(ProductInput::f32);  // the reference's products take fp32 activations
  test::expect_reference_logits(fp32, kIds, kProbeIds, kReference);
  // The same through a KVCache (f32 pages), as every compressed cache runs.
  KVCacheSpec spec;
  spec.key_codec = spec.value_codec = "f32";
  LlamaRunner cached(m, 8, 2, spec);
  cached.set_product_input(ProductInput::f32);
  test::expect_reference_logits(cached, kIds, kProbeIds, kReference);
}

TEST_F(Gemma3, TokenizerMatchesHuggingFaceTokenizers) {
  const GgufFile gguf(test::gemma3_path());
  const auto tok = load_gguf_tokenizer(gguf);
  EXPECT_EQ(tok->vocab_size(), 262144);
  EXPECT_EQ(tok->bos(), 2);
  EXPECT_EQ(tok->eos(), 1);
  for (const auto& c : kHuggingFaceCases) {
    const std::vector<int> ids = tok->encode(c.text);
    EXPECT_EQ(ids, c.ids) << "text: \"" << c.text << "\"";
    if (c.text.find("<start_of_turn>") == std::string::npos) {
      EXPECT_EQ(tok->decode(ids), c.text);
    } else {
      EXPECT_EQ(tok->decode(ids), "user\nHi there\n<b>bold</b>");  // control tokens have no text
    }
  }
}

}  // namespace
}  // namespace kvq
