// route.h — MODEL.md's MoE selection from the router's logits (fp32), on the host, and the
// routing margin beside it: how far the selection stands from changing — the K-th chosen expert's
// biased score above the best expert left out (among the groups kept), and with groups the last
// kept group's score above the best dropped one's; the smaller of the two. The selection ledger reports the margin at a
// mismatch, so a real routing bug (a large margin) can be told from a near-tie (a margin of a
// few ulps, where two exact implementations may differ only by their rounding).
#pragma once
#include <stddef.h>
#include "config.h" // sd_config

// Bytes of the work buffer sd_route_select needs for config c.
size_t sd_route_work_bytes(const sd_config *c);

// logits (E) of one token and the score correction bias (E): sel (K) in selection order, w (K)
// the weights (unbiased scores, renormalised and scaled as the config says), and, when margin is
// not NULL, s'[sel_K-1] - max s' over the experts not chosen (+inf when none is eligible), or,
// when G > 1 and a group was dropped, the last kept group's score minus the best dropped group's
// when that is smaller.
void sd_route_select(const float *logits, const float *bias, const sd_config *c, void *work, int *sel, float *w,
                     float *margin);

// The margin alone (allocates its work buffer: for the host oracle, not for a forward's loop);
// NAN when out of memory.
float sd_route_margin(const float *logits, const float *bias, const sd_config *c);
