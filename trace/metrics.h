// metrics.h — the acceptance metrics of speculative rounds under vLLM's names, beside ours, in
// the JSON a run prints and a receipt banks. The definitions (docs/METRICS.md) are vLLM's
// (SpecDecodingStats.observe_draft and its logger):
//   num_drafts                   rounds (one draft of k tokens each)
//   num_draft_tokens             drafted tokens, k per round
//   num_accepted_tokens          accepted drafted tokens (the bonus token not counted)
//   num_accepted_tokens_per_pos  [i] = rounds whose accepted prefix reached position i (n > i)
//   mean_acceptance_length       1 + num_accepted_tokens / num_drafts (the bonus included)
// and ours, which vLLM does not keep:
//   acceptance_histogram         [n] = rounds that accepted exactly n drafts, n = 0..k
#pragma once
#include "sample.h" // sd_accept_stats

struct cJSON;

// Adds the six keys above to object o for rounds of draft depth k (1..SD_STATS_MAX_POSITIONS).
void trace_metrics_add_vllm(struct cJSON *o, const sd_accept_stats *s, int k);
// The same keys as null (counts unknown, e.g. a burst parsed from a trace log).
void trace_metrics_add_unknown(struct cJSON *o);
