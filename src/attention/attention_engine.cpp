#include "attention/attention_engine.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "attention/isa.hpp"
#include "attention/online_softmax.hpp"
#include "attention/page_kernel.hpp"
#include "attention/page_loop.hpp"
#include "core/half.hpp"
#include "kvq/error.hpp"

namespace kvq::detail {
namespace {

struct GroupPlan {
  LayerView view;
  size_t row = 0;      // first row of the group in the gathered queries
  int n_q = 0;         // n_pos * G rows, ordered (pos, g)
  size_t first_page = 0;  // pages before it lie outside every query's window
  size_t n_pages = 0;     // pages from first_page that any of its queries sees
  size_t cut_below = 0;   // the largest window start of its queries
  size_t first_piece = 0;
  size_t n_pieces = 0;
};

// A split-K piece: pages [begin, end) of one group, with n_q states starting at state_row.
struct Piece {
  size_t group, begin, end, state_row;
};

// Per-worker scratch.
struct Workspace {
  std::vector<float> scores;      // max n_q x max(T, window) scores
  std::vector<float> out;         // max n_q x d: states mapped back to the original space
  std::vector<float> q;           // max n_q x d: queries prepared for a fused kernel
  std::vector<uint8_t> kernel;    // a fused kernel's scratch, kernel_scratch_bytes(max n_q, d) + 64 for alignment
  std::vector<AttnState> states;  // views of `out`
  std::vector<float> sinks;       // one kv head's sink tokens in fp32: keys [S][d], then values [S][d]
};

template <class Fn>
void for_each_task(ThreadPool* pool, size_t n, Fn&& fn) {
  if (pool) {
    pool->parallel_for(n, fn);
  } else {
    for (size_t i = 0; i < n; ++i) fn(i, 0);
  }
}

// r fp32 tokens at positions base .. base + r - 1 (the residual window, or the sinks), folded into the states of
// one group in the original space.
void attend_fp32(const float* keys, const float* values, int r, size_t base, int d, const float* q, int n_q,
                 const size_t* visible, const size_t* first, float* scores, size_t stride, AttnState* states) {
  if (r == 0) return;
  for (int i = 0; i < n_q; ++i) {
    const float* qi = q + static_cast<size_t>(i) * d;
    float* row = scores + static_cast<size_t>(i) * stride;
    const size_t seen = visible[i] > base ? std::min(visible[i] - base, static_cast<size_t>(r)) : 0;
    const size_t hidden = first[i] > base ? first[i] - base : 0;  // before a sliding window
    for (int t = 0; t < r; ++t) {
      if (static_cast<size_t>(t) >= seen || static_cast<size_t>(t) < hidden) {
        row[t] = -std::numeric_limits<float>::infinity();
        continue;
      }
      const float* kt = keys + static_cast<size_t>(t) * d;
      float s = 0;
      for (int c = 0; c < d; ++c) s += qi[c] * kt[c];
      row[t] = s;
    }
  }
  online_softmax_block(scores, stride, n_q, r, states);
  for (int i = 0; i < n_q; ++i) {
    const float* w = scores + static_cast<size_t>(i) * stride;
    float* o = states[i].o.data();
    for (int t = 0; t < r; ++t) {
      if (w[t] == 0.f) continue;
      const float* vt = values + static_cast<size_t>(t) * d;
      for (int c = 0; c < d; ++c) o[c] += w[t] * vt[c];
    }
  }
}

// The fp32 residual window of one group.
void attend_window(const LayerView& view, int kv_head, int d, const float* q, int n_q, const size_t* visible,
                   const size_t* first, float* scores, size_t stride, AttnState* states) {
  attend_fp32(view.residual_key(kv_head), view.residual_value(kv_head), view.residual_count, view.window_start(), d,
              q, n_q, visible, first, scores, stride, states);
}

// The f16 sink tokens of one group (positions 0 .. sink_count - 1), widened into `scratch` (2 x sink_count x d
// floats), their keys minus the key offset where pages and window hold centered keys.
void attend_sinks(const LayerView& view, int kv_head, int d, const float* q, int n_q, const size_t* visible,
                  const size_t* first, float* scores, size_t stride, AttnState* states, float* scratch) {
  const size_t s = static_cast<size_t>(view.sink_count), ud = static_cast<size_t>(d);
  if (s == 0) return;
  const uint16_t* keys = view.sink_keys + static_cast<size_t>(kv_head) * view.sink_stride;
  const uint16_t* values = view.sink_values + static_cast<size_t>(kv_head) * view.sink_stride;
  const float* offset = view.key_offset ? view.key_offset + static_cast<size_t>(kv_head) * ud : nullptr;
  for (size_t i = 0; i < s * ud; ++i) {
    scratch[i] = f16_to_f32(keys[i]) - (offset ? offset[i % ud] : 0.f);
    scratch[s * ud + i] = f16_to_f32(values[i]);
  }
  attend_fp32(scratch, scratch + s * ud, view.sink_count, 0, d, q, n_q, visible, first, scores, stride, states);
}

}  // namespace

// What a run allocates, kept for the next: vectors are cleared or resized, never shrunk.
struct AttentionEngine::Scratch {
  std::vector<GroupPlan> plan;
  std::vector<float> queries;
  std::vector<size_t> visible, first;
  std::vector<Piece> pieces;
  std::vector<size_t> slice_start;
  std::vector<float> piece_o;
  std::vector<AttnState> piece_states;
  std::vector<Workspace> ws;
};

AttentionEngine::AttentionEngine() : scratch_(std::make_unique<Scratch>()) {}
AttentionEngine::~AttentionEngine() = default;
AttentionEngine::AttentionEngine(AttentionEngine&&) noexcept = default;
AttentionEngine& AttentionEngine::operator=(AttentionEngine&&) noexcept = default;

void run_attention(const KVCache& cache, int layer, std::span<const QueryGroup> groups, int group_size,
                   const AttentionOptions& options, ThreadPool* pool) {
  AttentionEngine().run(cache, layer, groups, group_size, options, pool);
}

void AttentionEngine::run(const KVCache& cache, int layer, std::span<const QueryGroup> groups, int group_size,
                          const AttentionOptions& options, ThreadPool* pool) {
  Scratch& sc = *scratch_;
  const CacheConfig& cfg = cache.config();
  const Codec& kc = cache.key_codec(layer);
  const Codec& vc = cache.value_codec(layer);
  const int d = cfg.head_dim, G = group_size, m = vc.space_dim();
  const size_t T = static_cast<size_t>(cfg.block_tokens), ud = static_cast<size_t>(d);
  const float scale = options.resolved_scale(d);
  const PageKernel kernel = select_page_kernel(kc, vc, cfg.block_tokens, active_isa(), active_precision());

  // Plan: gather the queries (scaled) and their causal limits (and window starts), count the pages each group sees.
  std::vector<GroupPlan>& plan = sc.plan;
  plan.assign(groups.size(), GroupPlan{});
  size_t rows = 0;
  int max_q = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    plan[g].view = cache.view(groups[g].seq, layer);
    plan[g].row = rows;
    plan[g].n_q = groups[g].n_pos * G;
    rows += static_cast<size_t>(plan[g].n_q);
    max_q = std::max(max_q, plan[g].n_q);
  }
  std::vector<float>& queries = sc.queries;
  std::vector<size_t>& visible = sc.visible;
  std::vector<size_t>& first = sc.first;
  queries.resize(rows * ud);
  visible.resize(rows);
  first.resize(rows);
  for (size_t g = 0; g < groups.size(); ++g) {
    const QueryGroup& qg = groups[g];
    GroupPlan& gp = plan[g];
    const size_t length = gp.view.length();
    size_t max_visible = 0, min_first = std::numeric_limits<size_t>::max();
    for (int pos = 0; pos < qg.n_pos; ++pos)
      for (int j = 0; j < G; ++j) {
        const size_t row = gp.row + static_cast<size_t>(pos * G + j);
        const float* src = qg.q + static_cast<size_t>(pos) * qg.pos_stride + static_cast<size_t>(j) * ud;
        for (size_t c = 0; c < ud; ++c) {
          KVQ_CHECK(std::isfinite(src[c]), "attention: query of sequence ", qg.seq, " position ", pos, " head ",
                    qg.kv_head * G + j, " channel ", c, " is ", src[c]);
          queries[row * ud + c] = src[c] * scale;
        }
        visible[row] = std::min(qg.visible0 + static_cast<size_t>(pos), length);
        // The query's own position is visible - 1 (a decode sees every token, a prefill query its own).
        first[row] = options.window > 0 && visible[row] > options.window ? visible[row] - options.window : 0;
        max_visible = std::max(max_visible, visible[row]);
        min_first = std::min(min_first, first[row]);
        gp.cut_below = std::max(gp.cut_below, first[row]);
      }
    // Pages hold positions from P0 on (the sinks come first).
    const size_t P0 = gp.view.first_page_token();
    const size_t seen_pages = max_visible > P0 ? std::min(gp.view.pages.size(), (max_visible - P0 + T - 1) / T) : 0;
    gp.first_page = std::min(seen_pages, min_first > P0 ? (min_first - P0) / T : 0);
    gp.n_pages = seen_pages - gp.first_page;
  }

  // Split-K: the pages of all groups, in order, cut into equal slices; a slice breaks into one piece per group.
  size_t total_pages = 0;
  for (const auto& gp : plan) total_pages += gp.n_pages;
  const size_t workers = pool ? static_cast<size_t>(pool->size()) : 1;
  const size_t n_slices = std::min(options.splits > 0 ? static_cast<size_t>(options.splits) : workers, total_pages);
  std::vector<Piece>& pieces = sc.pieces;
  std::vector<size_t>& slice_start = sc.slice_start;
  pieces.clear();
  slice_start.assign(n_slices + 1, 0);
  size_t state_rows = 0;
  {
    size_t g = 0, group_start = 0;  // group g's pages are [group_start, group_start + n_pages) globally
    for (size_t s = 0; s < n_slices; ++s) {
      slice_start[s] = pieces.size();
      size_t lo = s * total_pages / n_slices;
      const size_t hi = (s + 1) * total_pages / n_slices;
      while (lo < hi) {
        while (lo >= group_start + plan[g].n_pages) group_start += plan[g++].n_pages;
        const size_t end = std::min(hi, group_start + plan[g].n_pages);
        if (plan[g].n_pieces++ == 0) plan[g].first_piece = pieces.size();
        pieces.push_back({g, lo - group_start, end - group_start, state_rows});
        state_rows += static_cast<size_t>(plan[g].n_q);
        lo = end;
      }
    }
    slice_start[n_slices] = pieces.size();
  }
  std::vector<float>& piece_o = sc.piece_o;
  std::vector<AttnState>& piece_states = sc.piece_states;
  piece_o.assign(state_rows * static_cast<size_t>(m), 0.f);
  piece_states.assign(state_rows, AttnState{});
  for (size_t i = 0; i < state_rows; ++i)
    piece_states[i].o = std::span<float>(piece_o.data() + i * static_cast<size_t>(m), static_cast<size_t>(m));

  const size_t window = static_cast<size_t>(cfg.residual_tokens + cfg.block_tokens - 1);
  const size_t sinks = static_cast<size_t>(cfg.sink_tokens);
  const size_t score_stride = std::max({T, window, sinks});
  std::vector<Workspace>& ws = sc.ws;
  ws.resize(workers);
  for (auto& w : ws) {
    w.scores.resize(static_cast<size_t>(max_q) * score_stride);
    w.out.resize(static_cast<size_t>(max_q) * ud);
    if (kernel.fn) {
      w.q.resize(static_cast<size_t>(max_q) * static_cast<size_t>(kc.space_dim()));
      w.kernel.resize(kernel_scratch_bytes(max_q, d) + 64);
    }
    w.states.resize(static_cast<size_t>(max_q));
    w.sinks.resize(2 * sinks * ud);
    for (int i = 0; i < max_q; ++i) w.states[i].o = std::span<float>(w.out.data() + i * ud, ud);
  }

  // Run 1: the page loops, the queries prepared once per (slice, group): a scorer, or the fused kernel's queries.
  for_each_task(pool, n_slices, [&](size_t s, int worker) {
    Workspace& w = ws[static_cast<size_t>(worker)];
    std::unique_ptr<Scorer> scorer;
    size_t prepared_group = groups.size();
    for (size_t p = slice_start[s]; p < slice_start[s + 1]; ++p) {
      const Piece& piece = pieces[p];
      const GroupPlan& gp = plan[piece.group];
      const size_t first_token = gp.view.first_page_token() + (gp.first_page + piece.begin) * T;
      if (piece.group != prepared_group) {
        if (kernel.fn) prepare_kernel_queries(kernel, kc, queries.data() + gp.row * ud, gp.n_q, w.q.data());
        scorer.reset();
        prepared_group = piece.group;
      }
      // The generic loop runs without a fused kernel, and on the pages a window cuts into (page_loop.hpp).
      if (!scorer && (!kernel.fn || first_token < gp.cut_below))
        scorer = kc.prepare(queries.data() + gp.row * ud, gp.n_q);
      PageRun run;
      run.cache = &cache;
      run.key_codec = &kc;
      run.value_codec = &vc;
      run.kernel = &kernel;
      run.scorer = scorer.get();
      run.q = w.q.data();
      run.kernel_scratch = w.kernel.data() + (64 - reinterpret_cast<uintptr_t>(w.kernel.data()) % 64) % 64;
      run.pages = gp.view.pages.subspan(gp.first_page + piece.begin, piece.end - piece.begin);
      run.first_token = first_token;
      run.kv_head = groups[piece.group].kv_head;
      run.n_q = gp.n_q;
      run.visible = visible.data() + gp.row;
      if (options.window > 0) {
        run.first = first.data() + gp.row;
        run.cut_below = gp.cut_below;
      }
      run.scores = w.scores.data();
      run.states = piece_states.data() + piece.state_row;
      attend_pages(run);
    }
  });

  // Run 2, per group: merge the pieces, map back once per query, add the fp32 window and the sinks, normalize, write
  // out.
  for_each_task(pool, groups.size(), [&](size_t g, int worker) {
    const GroupPlan& gp = plan[g];
    const QueryGroup& qg = groups[g];
    Workspace& w = ws[static_cast<size_t>(worker)];
    AttnState* states = w.states.data();
    for (int i = 0; i < gp.n_q; ++i) states[i].reset();
    if (gp.n_pieces > 0) {
      AttnState* acc = piece_states.data() + pieces[gp.first_piece].state_row;
      for (size_t p = gp.first_piece + 1; p < gp.first_piece + gp.n_pieces; ++p)
        for (int i = 0; i < gp.n_q; ++i) acc[i].merge(piece_states[pieces[p].state_row + static_cast<size_t>(i)]);
      vc.from_space(acc[0].o.data(), gp.n_q, w.out.data());
      for (int i = 0; i < gp.n_q; ++i) {
        states[i].m = acc[i].m;
        states[i].l = acc[i].l;
      }
    }
    attend_window(gp.view, qg.kv_head, d, queries.data() + gp.row * ud, gp.n_q, visible.data() + gp.row,
                  first.data() + gp.row, w.scores.data(), score_stride, states);
    attend_sinks(gp.view, qg.kv_head, d, queries.data() + gp.row * ud, gp.n_q, visible.data() + gp.row,
                 first.data() + gp.row, w.scores.data(), score_stride, states, w.sinks.data());
    for (int pos = 0; pos < qg.n_pos; ++pos)
      for (int j = 0; j < G; ++j) {
        AttnState& st = states[pos * G + j];
        st.normalize();
        // Finite queries and cache can still overflow a score (magnitudes near 1e19); say so rather than return NaN.
        KVQ_CHECK(std::all_of(st.o.begin(), st.o.end(), [](float x) { return std::isfinite(x); }),
                  "attention: the output of sequence ", qg.seq, " kv head ", qg.kv_head, " layer ", layer,
                  " is not finite (a score overflowed: queries or cached keys of extreme magnitude)");
        std::copy(st.o.begin(), st.o.end(),
                  qg.out + static_cast<size_t>(pos) * qg.pos_stride + static_cast<size_t>(j) * ud);
      }
  });
}

}  // namespace kvq::detail
