// receipt_compare.c — two sets of bursts side by side: phase shares, the verify sub-split, and
// what their env lines say they measured (receipt.h "comparing").
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "receipt.h"

static const char *const phase_rows[TRACE_N_PHASES] = {"draft", "verify", "accept", "roll", "maint"};
static const char *const vrow_names[RECEIPT_N_VROWS] = {"vkda", "scan", "vmla", "vrest", "vffn"};

typedef struct {
    receipt_side side;
    double share[TRACE_N_PHASES];   // percent of the five-phase total
    double vshare[RECEIPT_N_VROWS]; // percent of verify, over the bursts with a -v line
} shares;

// The TAG the set is compared under: `tag` itself, or the set's only TAG.
static sd_code pick_tag(const receipt_set *s, const char *label, const char *tag, const char **picked, sd_status *st) {
    if (s->n == 0) return sd_fail(st, SD_ERR_DATA, "%s: no bursts (no [TAG-phase] lines or burst records)", label);
    if (tag) { *picked = tag; return SD_OK; }
    for (size_t i = 1; i < s->n; i++)
        if (strcmp(s->bursts[i].tag, s->bursts[0].tag) != 0)
            return sd_fail(st, SD_ERR_DATA, "%s: holds bursts of tags '%s' and '%s'; choose one tag",
                           label, s->bursts[0].tag, s->bursts[i].tag);
    *picked = s->bursts[0].tag;
    return SD_OK;
}

static sd_code shares_of(const receipt_set *s, const char *label, const char *tag, shares *sh, sd_status *st) {
    memset(sh, 0, sizeof *sh);
    double ph[TRACE_N_PHASES] = {0}, total = 0, verify = 0, v[RECEIPT_N_VROWS] = {0};
    for (size_t i = 0; i < s->n; i++) {
        const receipt_burst *r = &s->bursts[i];
        if (strcmp(r->tag, tag) != 0) continue;
        if (sh->side.n_bursts++ == 0) sh->side.k = r->k;
        else if (r->k != sh->side.k) sh->side.k_mixed = 1;
        sh->side.rounds += r->rounds;
        for (int p = 0; p < TRACE_N_PHASES; p++) { ph[p] += r->phase_ms[p]; total += r->phase_ms[p]; }
        if (!r->has_v) continue;
        double n = (double)r->rounds; // per-round values back to burst totals
        double row[RECEIPT_N_VROWS] = {r->v_ms[TRACE_BUCKET_VKDA], r->v_ms[TRACE_BUCKET_SCAN],
                                       r->v_ms[TRACE_BUCKET_VMLA], r->vrest_ms, r->v_ms[TRACE_BUCKET_VFFN]};
        verify += r->per_round_ms[TRACE_PHASE_VERIFY] * n;
        for (int j = 0; j < RECEIPT_N_VROWS; j++) v[j] += row[j] * n;
    }
    if (sh->side.n_bursts == 0) return sd_fail(st, SD_ERR_DATA, "%s: no bursts of tag '%s'", label, tag);
    if (!(total > 0)) return sd_fail(st, SD_ERR_DATA, "%s: the phases sum to 0 ms; shares are undefined", label);
    for (int p = 0; p < TRACE_N_PHASES; p++) sh->share[p] = 100.0 * ph[p] / total;
    sh->side.has_v = verify > 0;
    for (int j = 0; sh->side.has_v && j < RECEIPT_N_VROWS; j++) sh->vshare[j] = 100.0 * v[j] / verify;
    sh->side.has_env = s->env_json != NULL;
    sh->side.interrupted = s->interrupted;
    return SD_OK;
}

static void add_row(receipt_comparison *c, const char *name, int verify_split, double a, double b) {
    receipt_row *r = &c->rows[c->n_rows++];
    *r = (receipt_row){.name = name, .verify_split = verify_split, .a = a, .b = b, .diff = b - a};
    r->over = fabs(r->diff) > c->tol_pp;
    c->n_over += r->over;
}

// ---------------------------------------------------------------------------------------------
// the env lines: what each receipt measured

// The env keys whose values must agree for two receipts to measure the same thing.
static const char *const env_keys[] = {"config_sha256", "weights_sha256", "draft_sha256", "k", "backend"};

static void env_value(const cJSON *env, const char *key, char *buf, size_t len) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(env, key);
    if (cJSON_IsString(v)) snprintf(buf, len, "%.64s", v->valuestring);
    else if (cJSON_IsNumber(v)) snprintf(buf, len, "%g", v->valuedouble);
    else snprintf(buf, len, "%s", v ? "null" : "absent");
}

static sd_code env_diffs(const receipt_set *a, const receipt_set *b, receipt_comparison *c, sd_status *st) {
    if (!a->env_json || !b->env_json) return SD_OK; // a trace log: nothing to check
    cJSON *ea = cJSON_Parse(a->env_json), *eb = cJSON_Parse(b->env_json);
    sd_code rc = ea && eb ? SD_OK : sd_fail(st, SD_ERR_DATA, "compare: %s's env line is not JSON", ea ? "B" : "A");
    for (size_t i = 0; !rc && i < sizeof env_keys / sizeof env_keys[0]; i++) {
        char va[72], vb[72];
        env_value(ea, env_keys[i], va, sizeof va);
        env_value(eb, env_keys[i], vb, sizeof vb);
        if (strcmp(va, vb) != 0 && c->n_env_diffs < RECEIPT_MAX_ENV_DIFFS)
            snprintf(c->env_diffs[c->n_env_diffs++], sizeof c->env_diffs[0], "%s (A %s, B %s)", env_keys[i], va, vb);
    }
    cJSON_Delete(ea);
    cJSON_Delete(eb);
    return rc;
}

sd_code receipt_compare(const receipt_set *a, const receipt_set *b, const char *tag, double tol_pp,
                        receipt_comparison *c, sd_status *st) {
    memset(c, 0, sizeof *c);
    if (!(tol_pp >= 0) || !isfinite(tol_pp))
        return sd_fail(st, SD_ERR_USAGE, "compare: tolerance must be a finite number >= 0 (got %g)", tol_pp);
    c->tol_pp = tol_pp;
    const char *tag_a = NULL, *tag_b = NULL;
    sd_code rc = pick_tag(a, "A", tag, &tag_a, st);
    if (rc == SD_OK) rc = pick_tag(b, "B", tag, &tag_b, st);
    if (rc != SD_OK) return rc;
    if (strcmp(tag_a, tag_b) != 0)
        return sd_fail(st, SD_ERR_DATA, "compare: A is tag '%s', B is tag '%s'; different loops "
                       "do not compare (choose a tag)", tag_a, tag_b);
    shares sa, sb;
    rc = shares_of(a, "A", tag_a, &sa, st);
    if (rc == SD_OK) rc = shares_of(b, "B", tag_b, &sb, st);
    if (rc == SD_OK) rc = env_diffs(a, b, c, st);
    if (rc != SD_OK) return rc;
    snprintf(c->tag, sizeof c->tag, "%s", tag_a);
    c->side[0] = sa.side;
    c->side[1] = sb.side;
    for (int p = 0; p < TRACE_N_PHASES; p++) add_row(c, phase_rows[p], 0, sa.share[p], sb.share[p]);
    if (sa.side.has_v && sb.side.has_v)
        for (int j = 0; j < RECEIPT_N_VROWS; j++) add_row(c, vrow_names[j], 1, sa.vshare[j], sb.vshare[j]);
    else if (sa.side.has_v || sb.side.has_v)
        c->v_only = sa.side.has_v ? 1 : 2;
    return SD_OK;
}

// ---------------------------------------------------------------------------------------------
// output

static void print_side(FILE *out, const char *label, const receipt_side *s) {
    fprintf(out, "  %s: %zu bursts, %llu rounds, k=", label, s->n_bursts, (unsigned long long)s->rounds);
    if (s->k_mixed) fprintf(out, "mixed");
    else fprintf(out, "%d", s->k);
    fprintf(out, "%s%s\n", s->has_v ? ", level-2 sub-split" : "", s->interrupted ? ", interrupted run" : "");
}

void receipt_comparison_print(const receipt_comparison *c, FILE *out) {
    if (!out) return;
    fprintf(out, "receipt compare: tag %s, tolerance %.2f pp\n", c->tag, c->tol_pp);
    print_side(out, "A", &c->side[0]);
    print_side(out, "B", &c->side[1]);
    fprintf(out, "%-8s %8s %8s %9s\n", "phase", "A%", "B%", "diff(pp)");
    for (int i = 0; i < c->n_rows; i++) {
        const receipt_row *r = &c->rows[i];
        if (r->verify_split && !c->rows[i - 1].verify_split) fprintf(out, "verify sub-split (percent of verify):\n");
        fprintf(out, "%-8s %8.2f %8.2f %+9.2f%s\n", r->name, r->a, r->b, r->diff, r->over ? "  beyond tolerance" : "");
    }
    if (c->v_only) fprintf(out, "verify sub-split: only %s has level-2 lines; not compared\n", c->v_only == 1 ? "A" : "B");
    if (c->n_over) fprintf(out, "%d row(s) beyond tolerance\n", c->n_over);
    else fprintf(out, "all rows within tolerance\n");
}

static cJSON *side_json(const receipt_side *s) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "bursts", (double)s->n_bursts);
    cJSON_AddNumberToObject(o, "rounds", (double)s->rounds);
    if (s->k_mixed) cJSON_AddStringToObject(o, "k", "mixed");
    else cJSON_AddNumberToObject(o, "k", s->k);
    cJSON_AddBoolToObject(o, "level2", s->has_v);
    cJSON_AddBoolToObject(o, "env_line", s->has_env);
    cJSON_AddBoolToObject(o, "interrupted", s->interrupted);
    return o;
}

char *receipt_comparison_json(const receipt_comparison *c, int forced) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "tag", c->tag);
    cJSON_AddNumberToObject(o, "tolerance_pp", c->tol_pp);
    cJSON_AddItemToObject(o, "a", side_json(&c->side[0]));
    cJSON_AddItemToObject(o, "b", side_json(&c->side[1]));
    cJSON *rows = cJSON_AddArrayToObject(o, "rows");
    for (int i = 0; rows && i < c->n_rows; i++) {
        const receipt_row *r = &c->rows[i];
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "name", r->name);
        cJSON_AddStringToObject(j, "of", r->verify_split ? "verify" : "round");
        cJSON_AddNumberToObject(j, "a_pct", r->a);
        cJSON_AddNumberToObject(j, "b_pct", r->b);
        cJSON_AddNumberToObject(j, "diff_pp", r->diff);
        cJSON_AddBoolToObject(j, "beyond_tolerance", r->over);
        cJSON_AddItemToArray(rows, j);
    }
    cJSON_AddNumberToObject(o, "rows_beyond_tolerance", c->n_over);
    cJSON_AddBoolToObject(o, "within_tolerance", c->n_over == 0);
    cJSON *d = cJSON_AddArrayToObject(o, "env_differences");
    for (int i = 0; d && i < c->n_env_diffs; i++) cJSON_AddItemToArray(d, cJSON_CreateString(c->env_diffs[i]));
    cJSON_AddBoolToObject(o, "forced", forced);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}
