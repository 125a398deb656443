// ledger.c — the selection ledger's slots, rows, drain, canary and comparison (ledger.h).
#include "ledger.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

// ---------------------------------------------------------------------------- the CPU stand-in
static void *host_alloc(int dev, size_t bytes, void *ctx) {
    (void)dev, (void)ctx;
    return malloc(bytes);
}
static void host_free(int dev, void *p, void *ctx) {
    (void)dev, (void)ctx;
    free(p);
}
static sd_code host_move(int dev, void *dst, const void *src, size_t bytes, void *ctx, sd_status *st) {
    (void)dev, (void)ctx, (void)st;
    memcpy(dst, src, bytes);
    return SD_OK;
}
static sd_code host_copy(int dev, void *dst, const void *src, size_t bytes, void *stream, void *ctx, sd_status *st) {
    (void)stream;
    return host_move(dev, dst, src, bytes, ctx, st);
}

const ledger_device *ledger_host_device(void) {
    static const ledger_device d = {.alloc = host_alloc, .free = host_free, .upload = host_move, .copy = host_copy,
                                    .download = host_move};
    return &d;
}

// ---------------------------------------------------------------------------- slots
void ledger_init(ledger *L, const ledger_device *d, bool armed) {
    memset(L, 0, sizeof *L);
    L->d = d;
    L->armed = armed;
}

void ledger_free(ledger *L) {
    for (int i = 0; i < L->n_slots; i++) {
        L->d->free(L->slots[i].dev, L->slots[i].sel, L->d->ctx);
        L->d->free(L->slots[i].dev, L->slots[i].w, L->d->ctx);
    }
    free(L->slots);
    free(L->host);
    memset(L, 0, sizeof *L);
}

static ledger_slot *find(ledger *L, int dev, int layer) {
    for (int i = 0; i < L->n_slots; i++)
        if (L->slots[i].dev == dev && L->slots[i].layer == layer) return &L->slots[i];
    return NULL;
}

// sel = -1 and w = 0 over the slot's n entries.
static sd_code fill_sentinel(ledger *L, ledger_slot *s, sd_status *st) {
    int *sel = malloc(sizeof(int) * (size_t)s->n);
    float *w = calloc((size_t)s->n, sizeof(float));
    sd_code rc = sel && w ? SD_OK : sd_fail(st, SD_ERR_SYS, "ledger: out of memory for %d sentinel entries", s->n);
    for (int i = 0; !rc && i < s->n; i++) sel[i] = -1;
    if (!rc) rc = L->d->upload(s->dev, s->sel, sel, sizeof(int) * (size_t)s->n, L->d->ctx, st);
    if (!rc) rc = L->d->upload(s->dev, s->w, w, sizeof(float) * (size_t)s->n, L->d->ctx, st);
    free(sel);
    free(w);
    s->filled = 0;
    return rc;
}

sd_code ledger_prearm(ledger *L, int dev, int layer, int n, sd_status *st) {
    if (!L->armed || find(L, dev, layer)) return SD_OK;
    if (n < 1) return sd_fail(st, SD_ERR_USAGE, "ledger: a slot of %d entries (device %d, layer %d)", n, dev, layer);
    if (L->n_slots == L->cap_slots) {
        const int cap = L->cap_slots ? 2 * L->cap_slots : 16;
        ledger_slot *g = realloc(L->slots, sizeof *g * (size_t)cap);
        if (!g) return sd_fail(st, SD_ERR_SYS, "ledger: out of memory for %d slots", cap);
        L->slots = g;
        L->cap_slots = cap;
    }
    ledger_slot s = {.dev = dev, .layer = layer, .n = n};
    s.sel = L->d->alloc(dev, sizeof(int) * (size_t)n, L->d->ctx);
    s.w = L->d->alloc(dev, sizeof(float) * (size_t)n, L->d->ctx);
    sd_code rc = s.sel && s.w ? fill_sentinel(L, &s, st)
                              : sd_fail(st, SD_ERR_SYS, "ledger: device %d: no memory for layer %d's slot (%d entries)", dev,
                                        layer, n);
    if (rc) {
        if (s.sel) L->d->free(dev, s.sel, L->d->ctx);
        if (s.w) L->d->free(dev, s.w, L->d->ctx);
        return rc;
    }
    L->slots[L->n_slots++] = s;
    return SD_OK;
}

sd_code ledger_record_device(ledger *L, int dev, int layer, const int *sel, const float *w, int n, void *stream,
                             sd_status *st) {
    L->device_entries++;
    if (!L->armed) return SD_OK;
    ledger_slot *s = find(L, dev, layer);
    if (!s || n < 1) return SD_OK; // never allocated here: a capture may be open
    const int m = n < s->n ? n : s->n;
    SD_TRY(L->d->copy(dev, s->sel, sel, sizeof(int) * (size_t)m, stream, L->d->ctx, st));
    SD_TRY(L->d->copy(dev, s->w, w, sizeof(float) * (size_t)m, stream, L->d->ctx, st));
    s->filled = m;
    return SD_OK;
}

sd_code ledger_record_host(ledger *L, int dev, int layer, int pos, const int *sel, const float *w, int k, float margin,
                           sd_status *st) {
    L->host_entries++;
    if (!L->armed) return SD_OK;
    if (k < 1 || k > LEDGER_MAX_K) return sd_fail(st, SD_ERR_USAGE, "ledger: %d experts a token (1..%d)", k, LEDGER_MAX_K);
    if (L->n_host == L->cap_host) {
        const size_t cap = L->cap_host ? 2 * L->cap_host : 256;
        ledger_row *g = realloc(L->host, sizeof *g * cap);
        if (!g) return sd_fail(st, SD_ERR_SYS, "ledger: out of memory for %zu host rows", cap);
        L->host = g;
        L->cap_host = cap;
    }
    ledger_row *r = &L->host[L->n_host++];
    memset(r, 0, sizeof *r);
    *r = (ledger_row){.dev = dev, .layer = layer, .pos = pos, .k = k, .margin = margin, .seq = L->host_entries};
    memcpy(r->sel, sel, sizeof(int) * (size_t)k);
    memcpy(r->w, w, sizeof(float) * (size_t)k);
    return SD_OK;
}

// ---------------------------------------------------------------------------- drain
static int by_key(const void *pa, const void *pb) {
    const ledger_row *a = pa, *b = pb;
    if (a->dev != b->dev) return a->dev < b->dev ? -1 : 1;
    if (a->layer != b->layer) return a->layer < b->layer ? -1 : 1;
    return (a->pos > b->pos) - (a->pos < b->pos);
}

// by_key, then the arm's record order: the order occ counts in.
static int by_record(const void *pa, const void *pb) {
    const ledger_row *a = pa, *b = pb;
    const int k = by_key(a, b);
    return k ? k : (a->seq > b->seq) - (a->seq < b->seq);
}

// by_key, then occ: the comparison's match.
static int by_match(const void *pa, const void *pb) {
    const ledger_row *a = pa, *b = pb;
    const int k = by_key(a, b);
    return k ? k : (a->occ > b->occ) - (a->occ < b->occ);
}

sd_code ledger_drain_device(ledger *L, int dev, int pos0, int T, int K, ledger_row **rows, size_t *n_rows,
                            sd_status *st) {
    if (!L->armed) return SD_OK;
    if (T < 1 || K < 1 || K > LEDGER_MAX_K) return sd_fail(st, SD_ERR_USAGE, "ledger drain: T %d, K %d", T, K);
    size_t add = 0;
    for (int i = 0; i < L->n_slots; i++) add += L->slots[i].dev == dev ? (size_t)T : 0;
    ledger_row *g = realloc(*rows, sizeof *g * (*n_rows + add + 1));
    if (!g) return sd_fail(st, SD_ERR_SYS, "ledger drain: out of memory for %zu rows", *n_rows + add);
    *rows = g;
    const size_t first = *n_rows;
    for (int i = 0; i < L->n_slots; i++) {
        ledger_slot *s = &L->slots[i];
        if (s->dev != dev) continue;
        int *sel = malloc(sizeof(int) * (size_t)s->n);
        float *w = malloc(sizeof(float) * (size_t)s->n);
        sd_code rc = sel && w ? SD_OK : sd_fail(st, SD_ERR_SYS, "ledger drain: out of memory");
        if (!rc) rc = L->d->download(dev, sel, s->sel, sizeof(int) * (size_t)s->n, L->d->ctx, st);
        if (!rc) rc = L->d->download(dev, w, s->w, sizeof(float) * (size_t)s->n, L->d->ctx, st);
        for (int t = 0; !rc && t < T; t++) {
            ledger_row *r = &g[(*n_rows)++];
            memset(r, 0, sizeof *r);
            *r = (ledger_row){.dev = dev, .layer = s->layer, .pos = pos0 + t, .k = K, .margin = NAN, .seq = L->drains};
            for (int j = 0; j < K; j++) {
                const int e = t * K + j;
                r->sel[j] = e < s->n ? sel[e] : -1;
                r->w[j] = e < s->n ? w[e] : 0.0f;
            }
        }
        free(sel);
        free(w);
        if (rc) return rc;
    }
    qsort(g + first, *n_rows - first, sizeof *g, by_key);
    L->drains++;
    return SD_OK;
}

void ledger_take_host(ledger *L, ledger_row **rows, size_t *n_rows) {
    *rows = L->host;
    *n_rows = L->n_host;
    L->host = NULL;
    L->n_host = L->cap_host = 0;
}

void ledger_reset_host(ledger *L) { L->n_host = 0; }

sd_code ledger_poison(ledger *L, int dev, sd_status *st) {
    for (int i = 0; i < L->n_slots; i++)
        if (L->slots[i].dev == dev) SD_TRY(fill_sentinel(L, &L->slots[i], st));
    return SD_OK;
}

sd_code ledger_canary(ledger *L, int dev, int layer, int entry, sd_status *st) {
    ledger_slot *s = find(L, dev, layer);
    if (!s) return sd_fail(st, SD_ERR_USAGE, "ledger canary: device %d layer %d has no slot", dev, layer);
    if (entry < 0 || entry >= s->n)
        return sd_fail(st, SD_ERR_USAGE, "ledger canary: entry %d outside the slot's %d", entry, s->n);
    float w;
    SD_TRY(L->d->download(dev, &w, s->w + entry, sizeof w, L->d->ctx, st));
    w = nextafterf(w, INFINITY);
    return L->d->upload(dev, s->w + entry, &w, sizeof w, L->d->ctx, st);
}

// ---------------------------------------------------------------------------- compare
static bool same_row(const ledger_row *a, const ledger_row *b) {
    return a->k == b->k && !memcmp(a->sel, b->sel, sizeof(int) * (size_t)a->k) &&
           !memcmp(a->w, b->w, sizeof(float) * (size_t)a->k);
}

// The row of `sorted` (ordered by by_match) with key's (dev, layer, pos, occ), or NULL.
static const ledger_row *lookup(const ledger_row *sorted, size_t n, const ledger_row *key) {
    return n ? bsearch(key, sorted, n, sizeof *sorted, by_match) : NULL;
}

// A copy of rows in record order within each key, each row's occ set (NULL when n is 0 or out
// of memory: *ok says which). by_record and by_match order the copy alike.
static ledger_row *sorted_copy(const ledger_row *rows, size_t n, bool *ok) {
    *ok = true;
    if (!n) return NULL;
    ledger_row *c = malloc(sizeof *c * n);
    if (!c) {
        *ok = false;
        return NULL;
    }
    memcpy(c, rows, sizeof *c * n);
    qsort(c, n, sizeof *c, by_record);
    for (size_t i = 0; i < n; i++) c[i].occ = i && !by_key(&c[i], &c[i - 1]) ? c[i - 1].occ + 1 : 0;
    return c;
}

// Is x earlier than the divergence recorded so far?
static bool earlier(const ledger_diff *d, const ledger_row *x) { return !d->found || by_key(x, &d->a) < 0; }

static void compare(const ledger_row *a0, size_t na, const ledger_row *b0, size_t nb,
                    bool (*keep)(const ledger_row *, const int *), const int *sel_key, ledger_diff *out) {
    memset(out, 0, sizeof *out);
    bool ok_a, ok_b;
    ledger_row *a = sorted_copy(a0, na, &ok_a), *b = sorted_copy(b0, nb, &ok_b);
    if (!ok_a || !ok_b) { // no memory to compare: every row counts as missing, never as matched
        out->missing = na + nb;
        out->found = na + nb > 0;
        if (na) out->a = a0[0];
        free(a);
        free(b);
        return;
    }
    for (size_t i = 0; i < na; i++) {
        if (!keep(&a[i], sel_key)) continue;
        out->compared++;
        const ledger_row *m = lookup(b, nb, &a[i]);
        const bool bad = !m || !same_row(&a[i], m);
        if (!bad) continue;
        if (m) out->mismatched++;
        else out->missing++;
        if (earlier(out, &a[i])) {
            out->found = true;
            out->a = a[i];
            if (m) out->b = *m;
            else out->b = (ledger_row){.dev = a[i].dev, .layer = a[i].layer, .pos = a[i].pos, .k = 0, .margin = NAN};
        }
    }
    for (size_t i = 0; i < nb; i++) { // rows only b has
        if (!keep(&b[i], sel_key) || lookup(a, na, &b[i])) continue;
        out->missing++;
        if (earlier(out, &b[i])) {
            out->found = true;
            out->a = (ledger_row){.dev = b[i].dev, .layer = b[i].layer, .pos = b[i].pos, .k = 0, .margin = NAN};
            out->b = b[i];
        }
    }
    free(a);
    free(b);
}

static bool keep_all(const ledger_row *r, const int *key) {
    (void)r, (void)key;
    return true;
}
static bool keep_layer(const ledger_row *r, const int *key) { return r->dev == key[0] && r->layer == key[1]; }

void ledger_compare(const ledger_row *a, size_t na, const ledger_row *b, size_t nb, ledger_diff *out) {
    compare(a, na, b, nb, keep_all, NULL, out);
}

void ledger_compare_layer(const ledger_row *a, size_t na, const ledger_row *b, size_t nb, int dev, int layer,
                          ledger_diff *out) {
    const int key[2] = {dev, layer};
    compare(a, na, b, nb, keep_layer, key, out);
}
