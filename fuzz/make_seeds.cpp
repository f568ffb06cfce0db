// Writes the seed corpora of the fuzz targets, corpus/<target>/, from small files made here: GGUF files (metadata
// of every type, tensor tables, tokenizers, tiny llama and gemma3 models), llama2.c checkpoints and tokenizers,
// saved caches of a few tokens for several codec pairs, codec specs and scripts for cache_attention. Where
// ../shared/data/models/ holds stories260K.bin and tok512.bin, their first bytes are seeds too (never the whole
// files: scripts/fuzz.sh gives the fuzzer tok512.bin itself where present). Run from the repository root:
//   cmake --build --preset release --target kvq_fuzz_seeds && build/release/fuzz/kvq_fuzz_seeds fuzz/corpus
// The committed corpora are its output plus the regression inputs of findings (named after what they guard).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "codec_test_specs.hpp"
#include "core/half.hpp"
#include "gguf_writer.hpp"
#include "kvq/cache.hpp"
#include "kvq/codec.hpp"
#include "kvq/detail/calibration.hpp"
#include "kvq/detail/ggml_quants.hpp"
#include "kvq/detail/gguf.hpp"
#include "kvq/detail/random.hpp"
#include "kvq/detail/synthetic.hpp"
#include "small_gguf_tokenizers.hpp"

namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;
using kvq::GgmlType;
using kvq::GgufType;
using kvq::test::GgufWriter;

void write(const fs::path& dir, const std::string& name, const Bytes& bytes) {
  fs::create_directories(dir);
  std::ofstream f(dir / name, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw std::runtime_error("cannot write " + (dir / name).string());
}

Bytes read(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  return Bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

template <class T>
void put(Bytes& out, T v) {
  GgufWriter::put(out, v);
}

// --- GGUF --------------------------------------------------------------------------------------------------

// rows x cols of `type` with small finite values: norms (F32) about 1; for the block formats random codes under a
// small fp16 scale (and minimum, for the _1 formats).
Bytes weights(GgmlType type, int rows, int cols, kvq::Rng& rng) {
  const size_t row_bytes = kvq::ggml_row_bytes(type, cols);
  Bytes data(row_bytes * static_cast<size_t>(rows));
  if (type == GgmlType::F32) {
    for (size_t i = 0; i < data.size() / 4; ++i) {
      const float v = static_cast<float>(1.0 + 0.1 * rng.normal());
      std::memcpy(data.data() + 4 * i, &v, 4);
    }
    return data;
  }
  if (type == GgmlType::F16) {
    for (size_t i = 0; i < data.size() / 2; ++i) {
      const uint16_t h = kvq::f32_to_f16(static_cast<float>(0.2 * rng.normal()));
      std::memcpy(data.data() + 2 * i, &h, 2);
    }
    return data;
  }
  for (uint8_t& b : data) b = static_cast<uint8_t>(rng.next_u64());
  const size_t block = kvq::ggml_traits(type).block_bytes;
  const bool has_min = type == GgmlType::Q4_1 || type == GgmlType::Q5_1;
  for (size_t at = 0; at < data.size(); at += block) {
    const uint16_t d = kvq::f32_to_f16(0.01f), m = kvq::f32_to_f16(-0.05f);
    std::memcpy(data.data() + at, &d, 2);
    if (has_min) std::memcpy(data.data() + at + 2, &m, 2);
  }
  return data;
}

struct TinyModel {
  const char* arch;
  int dim, hidden, heads, kv_heads, vocab;
  GgmlType q, k, v, o, gate, up, down, embedding;
};

// A one-layer model of `arch` with the tensors and metadata load_gguf_llama reads, and a tokenizer of `vocab` tokens.
Bytes tiny_gguf_model(const TinyModel& m) {
  kvq::Rng rng(7);
  GgufWriter w;
  const std::string a = m.arch;
  w.kv_string("general.architecture", a);
  w.kv<uint32_t>(a + ".embedding_length", GgufType::u32, static_cast<uint32_t>(m.dim));
  w.kv<uint32_t>(a + ".feed_forward_length", GgufType::u32, static_cast<uint32_t>(m.hidden));
  w.kv<uint32_t>(a + ".block_count", GgufType::u32, 1);
  w.kv<uint32_t>(a + ".attention.head_count", GgufType::u32, static_cast<uint32_t>(m.heads));
  w.kv<uint32_t>(a + ".attention.head_count_kv", GgufType::u32, static_cast<uint32_t>(m.kv_heads));
  w.kv<uint32_t>(a + ".context_length", GgufType::u32, 16);
  w.kv<float>(a + ".rope.freq_base", GgufType::f32, 10000.0f);
  w.kv<float>(a + ".attention.layer_norm_rms_epsilon", GgufType::f32, 1e-6f);
  const int head_dim = m.dim / m.heads, kv_dim = m.kv_heads * head_dim;
  if (a == "gemma3") {
    w.kv<uint32_t>(a + ".attention.sliding_window", GgufType::u32, 4);
    w.kv<uint32_t>(a + ".attention.key_length", GgufType::u32, static_cast<uint32_t>(head_dim));
    w.kv<uint32_t>(a + ".attention.value_length", GgufType::u32, static_cast<uint32_t>(head_dim));
  }
  std::vector<std::string> tokens;
  for (int t = 0; t < m.vocab; ++t) tokens.push_back(t == 0 ? "<unk>" : std::string(1, static_cast<char>('a' + t)));
  w.kv_string("tokenizer.ggml.model", "llama");
  w.kv_strings("tokenizer.ggml.tokens", tokens);
  const auto matrix = [&](const std::string& name, GgmlType type, int rows, int cols) {
    w.tensor(name, {static_cast<uint64_t>(cols), static_cast<uint64_t>(rows)}, type, weights(type, rows, cols, rng));
  };
  const auto vector = [&](const std::string& name, int n) {
    w.tensor(name, {static_cast<uint64_t>(n)}, GgmlType::F32, weights(GgmlType::F32, 1, n, rng));
  };
  matrix("token_embd.weight", m.embedding, m.vocab, m.dim);
  vector("output_norm.weight", m.dim);
  vector("blk.0.attn_norm.weight", m.dim);
  vector("blk.0.ffn_norm.weight", m.dim);
  matrix("blk.0.attn_q.weight", m.q, m.dim, m.dim);
  matrix("blk.0.attn_k.weight", m.k, kv_dim, m.dim);
  matrix("blk.0.attn_v.weight", m.v, kv_dim, m.dim);
  matrix("blk.0.attn_output.weight", m.o, m.dim, m.dim);
  matrix("blk.0.ffn_gate.weight", m.gate, m.hidden, m.dim);
  matrix("blk.0.ffn_up.weight", m.up, m.hidden, m.dim);
  matrix("blk.0.ffn_down.weight", m.down, m.dim, m.hidden);
  if (a == "gemma3") {
    vector("blk.0.attn_q_norm.weight", head_dim);
    vector("blk.0.attn_k_norm.weight", head_dim);
    vector("blk.0.post_attention_norm.weight", m.dim);
    vector("blk.0.post_ffw_norm.weight", m.dim);
  }
  return w.bytes();
}

// Metadata of every value type (arrays nested, empty and of strings), general.alignment 64 and a tensor table
// of assorted ggml types, shapes and ranks.
Bytes gguf_every_type() {
  kvq::Rng rng(3);
  GgufWriter w;
  w.set_alignment(64);
  w.kv<uint32_t>("general.alignment", GgufType::u32, 64);
  w.kv_string("general.name", "every type");
  w.kv<uint8_t>("u8", GgufType::u8, 200);
  w.kv<int8_t>("i8", GgufType::i8, -100);
  w.kv<uint16_t>("u16", GgufType::u16, 60000);
  w.kv<int16_t>("i16", GgufType::i16, -30000);
  w.kv<uint32_t>("u32", GgufType::u32, 4000000000u);
  w.kv<int32_t>("i32", GgufType::i32, -2000000000);
  w.kv<uint64_t>("u64", GgufType::u64, ~uint64_t{0});
  w.kv<int64_t>("i64", GgufType::i64, INT64_MIN);
  w.kv<float>("f32", GgufType::f32, 1.5f);
  w.kv<double>("f64", GgufType::f64, -2.25);
  w.kv<uint8_t>("bool", GgufType::boolean, 1);
  w.kv_strings("strings", {"a", "", "\xE2\x96\x81x"});
  w.kv_array<float>("floats", GgufType::f32, {0.5f, -1.0f});
  w.kv_array<int64_t>("ints", GgufType::i64, {-1, 2, 3});
  w.kv_array<uint16_t>("empty", GgufType::u16, {});
  Bytes nested;  // an array of two arrays of u8
  put<uint32_t>(nested, static_cast<uint32_t>(GgufType::array));
  put<uint64_t>(nested, 2);
  for (int i = 0; i < 2; ++i) {
    put<uint32_t>(nested, static_cast<uint32_t>(GgufType::u8));
    put<uint64_t>(nested, 1);
    put<uint8_t>(nested, static_cast<uint8_t>(i));
  }
  w.kv_raw("nested", GgufType::array, nested);
  w.tensor("f32", {4}, GgmlType::F32, weights(GgmlType::F32, 1, 4, rng));
  w.tensor("q4_0", {32, 2}, GgmlType::Q4_0, weights(GgmlType::Q4_0, 2, 32, rng));
  w.tensor("q8_0", {32, 1, 1}, GgmlType::Q8_0, weights(GgmlType::Q8_0, 1, 32, rng));
  w.tensor("q4_k", {256}, GgmlType::Q4_K, Bytes(kvq::ggml_row_bytes(GgmlType::Q4_K, 256), 0));
  w.tensor("bf16", {2, 2, 1, 2}, GgmlType::BF16, Bytes(16, 0x3f));
  return w.bytes();
}

// --- llama2.c ------------------------------------------------------------------------------------------------

// A complete llama2.c checkpoint of one layer: dim 8, hidden 8, 2 heads, 1 kv head, vocab 8, seq_len 4; a negative
// vocab_size stores its own classifier.
Bytes tiny_llama2c(bool shared_classifier) {
  const int32_t dim = 8, hidden = 8, layers = 1, heads = 2, kv_heads = 1, vocab = 8, seq = 4;
  const int32_t kv_dim = dim / heads * kv_heads, head = dim / heads;
  Bytes out;
  for (int32_t v : {dim, hidden, layers, heads, kv_heads, shared_classifier ? vocab : -vocab, seq}) put(out, v);
  const size_t floats = vocab * dim + dim + dim * dim + 2 * dim * kv_dim + dim * dim + dim + 3 * dim * hidden + dim +
                        seq * head + (shared_classifier ? 0 : vocab * dim);
  kvq::Rng rng(11);
  for (size_t i = 0; i < floats; ++i) put(out, static_cast<float>(0.3 * rng.normal()));
  return out;
}

// A llama2.c tokenizer.bin: max_token_length, then {score, length, bytes} per token.
Bytes llama2c_tokenizer(const std::vector<std::string>& pieces) {
  Bytes out;
  put<int32_t>(out, 8);
  float score = 0;
  for (const std::string& p : pieces) {
    put(out, score -= 1);
    put(out, static_cast<int32_t>(p.size()));
    out.insert(out.end(), p.begin(), p.end());
  }
  return out;
}

// The first tokens of a llama2.c tokenizer.bin, up to about `budget` bytes, cut at a token's end.
Bytes tokenizer_head(const Bytes& file, size_t budget) {
  size_t pos = 4;
  while (pos + 8 <= file.size()) {
    int32_t len;
    std::memcpy(&len, file.data() + pos + 4, 4);
    const size_t next = pos + 8 + static_cast<size_t>(len);
    if (len < 0 || next > file.size() || next > budget) break;
    pos = next;
  }
  return Bytes(file.begin(), file.begin() + static_cast<std::ptrdiff_t>(pos));
}

// --- caches --------------------------------------------------------------------------------------------------

struct CacheSeed {
  const char* name;
  const char* key;
  const char* value;
  int residual, tokens;
  bool center_keys;
  int sink_tokens = 0;
};

// A saved cache of d = 16, T = 64, one layer, one kv head: three sequences (the middle one removed) holding `tokens`
// and 3 tokens. Below T + R tokens everything stays in the fp32 windows; above, pages are written.
Bytes saved_cache(const CacheSeed& s, const fs::path& scratch) {
  kvq::CacheConfig c;
  c.n_kv_heads = 1;
  c.head_dim = 16;
  c.block_tokens = 64;
  c.key_codec = s.key;
  c.value_codec = s.value;
  c.residual_tokens = s.residual;
  c.capacity_pages = 2;
  c.center_keys = s.center_keys;
  c.sink_tokens = s.sink_tokens;
  kvq::KVCache cache(c);
  const size_t n = static_cast<size_t>(s.tokens), drawn = std::max<size_t>(n, 3);
  const auto keys = kvq::sample_profile(kvq::key_like_profile(16, 1), drawn, 2);
  const auto values = kvq::gaussian_vectors(drawn, 16, 3);
  const kvq::SeqId a = cache.add_sequence(), b = cache.add_sequence(), last = cache.add_sequence();
  cache.append(a, 0, keys.data(), values.data(), n);
  cache.append(last, 0, keys.data(), values.data(), 3);
  cache.remove_sequence(b);
  const fs::path file = scratch / s.name;
  cache.save(file.string());
  Bytes bytes = read(file);
  fs::remove(file);
  return bytes;
}

// --- cache_attention scripts -------------------------------------------------------------------------------------

// The bytes cache_attention_fuzzer.cpp decodes: configuration, then operations.
Bytes attention_script(uint8_t pair, uint8_t d128, uint8_t residual, bool poison) {
  Bytes b = {pair, 1, 1, 1, d128, 0, residual, 1, 0x02};  // group 32, 2 kv heads, 2 queries each, T 64, 16 pages
  const Bytes add = {0}, attend = {3, 1, 1};
  const Bytes append_100 = {2, 0, 99, 6, 0x03}, append_40 = {2, 0, 39, 5, 0x02}, append_7 = {2, 0, 6, 6, 0x03};
  const Bytes poisoned = {2, 0, 9, 6, 0x00, 0x34, 0x12}, windowed = {3, 2, 0, 50};
  for (const Bytes* op : {&add, &append_100, &attend, &append_40, &add, &append_7, &windowed})
    b.insert(b.end(), op->begin(), op->end());
  if (poison) b.insert(b.end(), poisoned.begin(), poisoned.end());
  b.insert(b.end(), attend.begin(), attend.end());
  return b;
}

// The first four bytes codec_spec_fuzzer.cpp reads (dimension 64 or 128, T 64 or 16, key or value, 5 tokens) and
// the spec.
Bytes codec_spec_input(std::string_view spec, uint8_t variant) {
  Bytes b = {static_cast<uint8_t>(variant % 2 ? 7 : 3), static_cast<uint8_t>(variant % 3 ? 64 : 16),
             static_cast<uint8_t>(variant % 2), 4};
  b.insert(b.end(), spec.begin(), spec.end());
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR (fuzz/corpus)\n", argv[0]);
    return 1;
  }
  const fs::path out = argv[1];
  const fs::path models = fs::path(KVQ_SOURCE_DIR) / "../shared/data/models";

  // GGUF files.
  const Bytes llama = tiny_gguf_model({"llama", 32, 32, 2, 1, 8, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1,
                                       GgmlType::Q5_1, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::F16});
  const Bytes gemma = tiny_gguf_model({"gemma3", 16, 16, 2, 1, 8, GgmlType::F16, GgmlType::F16, GgmlType::F16,
                                       GgmlType::F16, GgmlType::F16, GgmlType::F16, GgmlType::F16, GgmlType::F16});
  write(out / "gguf", "every_type.gguf", gguf_every_type());
  GgufWriter v2;
  v2.set_version(2);
  v2.kv_string("general.architecture", "llama");
  v2.tensor("t", {2}, GgmlType::F32, Bytes(8, 0));
  write(out / "gguf", "version2.gguf", v2.bytes());
  write(out / "gguf", "tokenizer_sentencepiece.gguf", kvq::fuzz::sentencepiece_gguf(16));

  write(out / "checkpoint", "tiny_llama.gguf", llama);
  write(out / "checkpoint", "tiny_gemma3.gguf", gemma);
  write(out / "checkpoint", "tiny_llama2c.bin", tiny_llama2c(true));
  write(out / "checkpoint", "tiny_llama2c_own_classifier.bin", tiny_llama2c(false));
  if (fs::exists(models / "stories260K.bin")) {
    const Bytes stories = read(models / "stories260K.bin");
    write(out / "checkpoint", "stories260K_first_1k.bin", Bytes(stories.begin(), stories.begin() + 1024));
  }

  write(out / "gguf_tokenizer", "sentencepiece.gguf", kvq::fuzz::sentencepiece_gguf(16));
  write(out / "gguf_tokenizer", "byte_level_bpe_gpt2.gguf", kvq::fuzz::byte_level_bpe_gguf("gpt2"));
  write(out / "gguf_tokenizer", "byte_level_bpe_smollm.gguf", kvq::fuzz::byte_level_bpe_gguf("smollm"));

  // llama2.c tokenizers.
  std::vector<std::string> pieces = {"<unk>", "\n<s>\n", "\n</s>\n", "<0x0A>", "<0xE6>", " ", "a", "b", "c", " a",
                                     "ab", " ab", "\xC3\xA9"};
  write(out / "llama2c_tokenizer", "small.bin", llama2c_tokenizer(pieces));
  if (fs::exists(models / "tok512.bin"))
    write(out / "llama2c_tokenizer", "tok512_first_2k.bin", tokenizer_head(read(models / "tok512.bin"), 2048));

  // Texts for each tokenizer of tokenizer_text_fuzzer.cpp (its first byte).
  const std::vector<std::string> texts = {
      "Once upon a time, there was a little girl.", " leading space,  two  spaces\n\nnew lines\t\ttabs ",
      "na\xC3\xAFve caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xF0\x9F\x99\x82 123 4567",
      "<s>control</s><start_of_turn><|im_start|>user\n<|im_end|>", "\xFF\xFE\xC0\x80 \xE2\x82 \xED\xA0\x80z"};
  for (uint8_t tok = 0; tok < 4; ++tok)
    for (size_t i = 0; i < texts.size(); ++i) {
      Bytes b = {tok};
      b.insert(b.end(), texts[i].begin(), texts[i].end());
      write(out / "tokenizer_text", "tokenizer" + std::to_string(tok) + "_text" + std::to_string(i), b);
    }

  // Saved caches, whole and as payloads behind cache_payload_fuzzer's version byte.
  const fs::path scratch = fs::temp_directory_path();
  for (const CacheSeed& s : {CacheSeed{"f16_f16_windows", "f16", "f16", 64, 5, false},
                             CacheSeed{"int4_int8_one_page", "int4:16", "int8:16", 0, 70, false},
                             CacheSeed{"int4_centered_one_page", "int4:16", "f16", 0, 66, true},
                             CacheSeed{"kivi_windows", "kivi:2,g=16", "kivi:4,g=16", 64, 4, false},
                             CacheSeed{"turbo_qjl_windows", "turbo_prod:3", "qjl", 128, 6, false},
                             CacheSeed{"turbo_mse_rvq_windows", "turbo_mse:2", "turbo_rvq:1", 64, 2, false},
                             CacheSeed{"int4_sinks_one_page", "int4:16", "turbo_mse:3", 0, 70, true, 4}}) {
    const Bytes file = saved_cache(s, scratch);
    write(out / "cache_file", std::string(s.name) + ".kvqcache", file);
    uint32_t version = 0;  // the header's, at byte 8 (4 without sinks, 5 with)
    std::memcpy(&version, file.data() + 8, 4);
    Bytes payload = {static_cast<uint8_t>(version - 2)};  // cache_payload_fuzzer's version byte
    payload.insert(payload.end(), file.begin() + 24, file.end());
    write(out / "cache_payload", std::string(s.name) + ".payload", payload);
  }

  // Calibration files without their checksum line (calibration_file_fuzzer appends it): one with a trained
  // vecinfer state, one without, and the version 1 form.
  for (const bool trained : {true, false}) {
    kvq::Calibration c;
    c.model = {"llama", 2, 4, 2, 16, 0x12345678u, "rope_adjacent_pairs"};
    c.budget_bits = 3, c.calibration_tokens = 256, c.sink_tokens = trained ? 1 : 0, c.predicted_kld = 0.25;
    c.layers = {{"int4", "kivi:2", true}, {"turbo_mse:3", "f16"}};
    if (trained) {
      const auto codec = kvq::make_codec("vecinfer:8/4", {16, 64, 0, kvq::Role::value});
      std::vector<float> x(256 * 16);
      kvq::Rng rng(1);
      for (float& v : x) v = static_cast<float>(rng.normal());
      codec->train(x.data(), 256);
      c.layers[1].value = "vecinfer:8/4";
      c.layers[1].value_state = codec->state();
    }
    const fs::path file = scratch / "kvq_seed.calib";
    kvq::save_calibration(c, file);
    Bytes text = read(file);
    fs::remove(file);
    text.resize(std::string_view(reinterpret_cast<const char*>(text.data()), text.size()).rfind("crc32c "));
    write(out / "calibration_file", trained ? "trained_state.calib" : "untrained.calib", text);
  }
  const std::string version1 =
      "kvq-calibration 1\narchitecture llama2.c\nlayers 1\nheads 2\nkv_heads 1\nhead_dim 16\nmodel_crc32c "
      "0000abcd\nchannel_layout rope_halves\nbudget_bits 4\npredicted_kld 0.5\nlayer 0 int4 turbo_mse:3\n";
  write(out / "calibration_file", "version1.calib", Bytes(version1.begin(), version1.end()));

  // Codec specs: every spec the tests sweep, and options.
  std::vector<std::string> specs = kvq::test::codec_test_specs();
  for (const char* s : {"int4,rot=srft", "turbo_mse:3,rot=householder:4", "turbo_prod:2,rot=haar", "qjl:64",
                        "vecinfer:10/8,smooth=0", "kivi:4,g=32", "int8:64,rot=identity", "f16,x=1", "int4:7"})
    specs.emplace_back(s);
  for (size_t i = 0; i < specs.size(); ++i)
    write(out / "codec_spec", "spec" + std::to_string(i), codec_spec_input(specs[i], static_cast<uint8_t>(i)));

  // cache_attention scripts: every codec pair, d 64 and 128, windows of 0, T and 2T.
  for (uint8_t pair = 0; pair < 17; ++pair)
    write(out / "cache_attention", "pair" + std::to_string(pair),
          attention_script(pair, pair % 2, pair % 3, pair % 4 == 0));
  return 0;
}
