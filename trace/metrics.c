// metrics.c — vLLM's names for the acceptance metrics (metrics.h).
#include "metrics.h"
#include <cjson/cJSON.h>

static const char *const keys[] = {"num_drafts", "num_draft_tokens", "num_accepted_tokens",
                                   "num_accepted_tokens_per_pos", "mean_acceptance_length", "acceptance_histogram"};

void trace_metrics_add_vllm(cJSON *o, const sd_accept_stats *s, int k) {
    if (k < 0) k = 0;
    if (k > SD_STATS_MAX_POSITIONS) k = SD_STATS_MAX_POSITIONS;
    cJSON_AddNumberToObject(o, keys[0], (double)s->rounds);
    cJSON_AddNumberToObject(o, keys[1], (double)s->drafted);
    cJSON_AddNumberToObject(o, keys[2], (double)s->accepted);
    cJSON *pos = cJSON_AddArrayToObject(o, keys[3]);
    for (int i = 0; pos && i < k; i++) cJSON_AddItemToArray(pos, cJSON_CreateNumber((double)s->per_position[i]));
    cJSON_AddNumberToObject(o, keys[4], sd_stats_mean_accepted_length(s));
    cJSON *hist = cJSON_AddArrayToObject(o, keys[5]);
    for (int n = 0; hist && n <= k; n++) cJSON_AddItemToArray(hist, cJSON_CreateNumber((double)s->histogram[n]));
}

void trace_metrics_add_unknown(cJSON *o) {
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) cJSON_AddNullToObject(o, keys[i]);
}
