// test_safetensors.c — safetensors reader/writer (round trip, determinism, a table of corrupt
// files each with the error it must give) and the sha256 digests.
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "digest.h"      // sd_sha256_file, sd_sha256_buf
#include "safetensors.h" // sd_st_open, sd_st_write, sd_st_find

// ---------------------------------------------------------------------------------------------
// a fresh temporary folder per test

static char tmpdir[64];

static void make_tmpdir(void) {
    strcpy(tmpdir, "/tmp/sd_st_XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp");
}

static int remove_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

static void remove_tmpdir(void) { nftw(tmpdir, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

TestSuite(safetensors, .init = make_tmpdir, .fini = remove_tmpdir);

static void tmp_path(char out[256], const char *name) { snprintf(out, 256, "%s/%s", tmpdir, name); }

static unsigned char *read_all(const char *path, size_t *len) {
    FILE *fp = fopen(path, "rb");
    cr_assert_not_null(fp, "open %s", path);
    fseek(fp, 0, SEEK_END);
    *len = (size_t)ftell(fp);
    fseek(fp, 0, SEEK_SET);
    unsigned char *buf = malloc(*len + 1);
    cr_assert_eq(fread(buf, 1, *len, fp), *len);
    fclose(fp);
    return buf;
}

static int count_entries(const char *dir) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "ls -A %s | wc -l", dir);
    FILE *p = popen(cmd, "r");
    int n = -1;
    cr_assert_eq(fscanf(p, "%d", &n), 1);
    pclose(p);
    return n;
}

// A file written byte by byte: u64 LE header length, header text, data_len zero bytes, then the
// last `cut` bytes removed.
static void write_raw(const char *path, uint64_t hlen, const char *header, size_t data_len, size_t cut) {
    size_t text = strlen(header), total = 8 + text + data_len;
    unsigned char *buf = calloc(1, total);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(hlen >> (8 * i));
    memcpy(buf + 8, header, text);
    FILE *fp = fopen(path, "wb");
    cr_assert_not_null(fp);
    cr_assert_eq(fwrite(buf, 1, total - cut, fp), total - cut);
    fclose(fp);
    free(buf);
}

// ---------------------------------------------------------------------------------------------
// round trip and determinism

static float w_f32[6] = {1.5f, -2.0f, 3.25f, 0.0f, -0.0f, 1e-30f};
static uint16_t w_bf16[4] = {0x3f80, 0xbf80, 0x7f80, 0x0001};
static uint16_t w_f16[4] = {0x3c00, 0xc000, 0x7c00, 0x8001};
static int32_t w_i32[3] = {-1, 0, 2147483647};
static double w_f64 = 3.141592653589793;
static int64_t w_i64[2] = {INT64_MIN, 42};

#define N_SAMPLE 7
static const sd_st_tensor SAMPLE[N_SAMPLE] = {
    {.name = "layers.0.w", .dtype = SD_DT_F32, .ndim = 2, .shape = {2, 3}, .data = w_f32, .nbytes = sizeof w_f32},
    {.name = "bf", .dtype = SD_DT_BF16, .ndim = 1, .shape = {4}, .data = w_bf16, .nbytes = sizeof w_bf16},
    {.name = "empty", .dtype = SD_DT_F32, .ndim = 2, .shape = {0, 5}, .data = NULL, .nbytes = 0},
    {.name = "half", .dtype = SD_DT_F16, .ndim = 2, .shape = {2, 2}, .data = w_f16, .nbytes = sizeof w_f16},
    {.name = "ids", .dtype = SD_DT_I32, .ndim = 1, .shape = {3}, .data = w_i32, .nbytes = sizeof w_i32},
    {.name = "scalar", .dtype = SD_DT_F64, .ndim = 0, .shape = {0}, .data = &w_f64, .nbytes = sizeof w_f64},
    {.name = "big", .dtype = SD_DT_I64, .ndim = 1, .shape = {2}, .data = w_i64, .nbytes = sizeof w_i64},
};

static void write_sample(const char *path) {
    sd_status st = {0};
    cr_assert_eq(sd_st_write(path, SAMPLE, N_SAMPLE, &st), SD_OK, "%s", st.msg);
}

Test(safetensors, round_trip) {
    char path[256];
    tmp_path(path, "rt.safetensors");
    write_sample(path);
    sd_st_file f;
    sd_status st = {0};
    cr_assert_eq(sd_st_open(path, &f, &st), SD_OK, "%s", st.msg);
    cr_assert_eq(f.n, N_SAMPLE);
    for (int i = 0; i < N_SAMPLE; i++) {
        const sd_st_tensor *want = &SAMPLE[i], *got = &f.tensors[i]; // contiguous, so same order
        cr_assert_str_eq(got->name, want->name);
        cr_assert_eq(sd_st_find(&f, want->name), got);
        cr_assert_eq(got->dtype, want->dtype, "%s", want->name);
        cr_assert_eq(got->ndim, want->ndim, "%s", want->name);
        for (int d = 0; d < want->ndim; d++) cr_assert_eq(got->shape[d], want->shape[d], "%s", want->name);
        cr_assert_eq(got->nbytes, want->nbytes, "%s", want->name);
        cr_assert_eq(sd_st_numel(got), sd_st_numel(want), "%s", want->name);
        cr_assert(want->nbytes == 0 || memcmp(got->data, want->data, want->nbytes) == 0, "%s bytes", want->name);
    }
    cr_assert_eq(sd_st_numel(sd_st_find(&f, "scalar")), 1);
    cr_assert_eq(sd_st_numel(sd_st_find(&f, "empty")), 0);
    sd_st_close(&f);
}

Test(safetensors, writer_is_deterministic_and_pads_header) {
    char a[256], b[256];
    tmp_path(a, "a.safetensors");
    tmp_path(b, "b.safetensors");
    write_sample(a);
    write_sample(b);
    size_t na, nb;
    unsigned char *ba = read_all(a, &na), *bb = read_all(b, &nb);
    cr_assert_eq(na, nb);
    cr_assert(memcmp(ba, bb, na) == 0, "two writes differ");
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | ba[i];
    cr_assert_eq(hlen % 8, 0, "header length %llu", (unsigned long long)hlen);
    size_t data = 0;
    for (int i = 0; i < N_SAMPLE; i++) data += SAMPLE[i].nbytes;
    cr_assert_eq(na, 8 + hlen + data);
    cr_assert_eq(ba[8], '{');
    free(ba);
    free(bb);
    cr_assert_eq(count_entries(tmpdir), 2, "a temporary file was left behind");
}

Test(safetensors, reader_accepts_odd_header_length) {
    // Data then starts at an odd offset: the reader must not require alignment.
    const char *hdr = "{\"w\": {\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    cr_assert_eq(strlen(hdr) % 2, 1);
    char path[256];
    tmp_path(path, "odd.safetensors");
    FILE *fp = fopen(path, "wb");
    uint64_t hlen = strlen(hdr);
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)(hlen >> (8 * i));
    float v[2] = {1.5f, -2.25f};
    fwrite(len8, 1, 8, fp);
    fwrite(hdr, 1, hlen, fp);
    fwrite(v, 1, sizeof v, fp);
    fclose(fp);
    sd_st_file f;
    sd_status st = {0};
    cr_assert_eq(sd_st_open(path, &f, &st), SD_OK, "%s", st.msg);
    float got[2];
    memcpy(got, sd_st_find(&f, "w")->data, sizeof got);
    cr_assert(got[0] == 1.5f && got[1] == -2.25f);
    sd_st_close(&f);
}

Test(safetensors, find_missing_is_null_and_close_is_idempotent) {
    char path[256];
    tmp_path(path, "f.safetensors");
    write_sample(path);
    sd_st_file f;
    sd_status st = {0};
    cr_assert_eq(sd_st_open(path, &f, &st), SD_OK, "%s", st.msg);
    cr_assert_null(sd_st_find(&f, "no.such.tensor"));
    cr_assert_null(sd_st_find(&f, ""));
    sd_st_close(&f);
    sd_st_close(&f);
    sd_st_file zero = {0};
    sd_st_close(&zero);
    cr_assert_null(sd_st_find(&zero, "bf"));
}

Test(safetensors, empty_file_list_round_trips) {
    char path[256];
    tmp_path(path, "none.safetensors");
    sd_status st = {0};
    cr_assert_eq(sd_st_write(path, NULL, 0, &st), SD_OK, "%s", st.msg);
    sd_st_file f;
    cr_assert_eq(sd_st_open(path, &f, &st), SD_OK, "%s", st.msg);
    cr_assert_eq(f.n, 0);
    sd_st_close(&f);
}

// ---------------------------------------------------------------------------------------------
// write failures leave nothing behind

Test(safetensors, write_into_missing_folder_fails_cleanly) {
    char path[256];
    tmp_path(path, "no_such_dir/x.safetensors");
    sd_status st = {0};
    cr_assert_eq(sd_st_write(path, SAMPLE, N_SAMPLE, &st), SD_ERR_SYS);
    cr_assert(strstr(st.msg, path) && strstr(st.msg, "No such file or directory"), "%s", st.msg);
    cr_assert_eq(count_entries(tmpdir), 0);
}

// A target that is a folder is refused before anything is written (atomic_file.h), never
// replaced, and no temporary is left.
Test(safetensors, a_folder_as_target_is_refused_leaving_nothing) {
    char path[256];
    tmp_path(path, "is_a_dir");
    cr_assert_eq(mkdir(path, 0755), 0);
    sd_status st = {0};
    cr_assert_eq(sd_st_write(path, SAMPLE, N_SAMPLE, &st), SD_ERR_USAGE);
    cr_assert(strstr(st.msg, path) && strstr(st.msg, "refusing"), "%s", st.msg);
    cr_assert_eq(count_entries(tmpdir), 1, "only the folder may remain");
}

Test(safetensors, writer_rejects_inconsistent_tensor) {
    sd_st_tensor bad = SAMPLE[0];
    bad.nbytes = 20; // F32 [2,3] needs 24
    char path[256];
    tmp_path(path, "bad.safetensors");
    sd_status st = {0};
    cr_assert_eq(sd_st_write(path, &bad, 1, &st), SD_ERR_DATA);
    cr_assert(strstr(st.msg, "layers.0.w") && strstr(st.msg, "needs 24"), "%s", st.msg);
    sd_st_tensor dup[2] = {SAMPLE[1], SAMPLE[1]};
    cr_assert_eq(sd_st_write(path, dup, 2, &st), SD_ERR_DATA);
    cr_assert(strstr(st.msg, "duplicate tensor name 'bf'"), "%s", st.msg);
    cr_assert_eq(count_entries(tmpdir), 0);
}

// ---------------------------------------------------------------------------------------------
// corrupt files: each must fail with SD_ERR_DATA, naming the path, with the expected text

// One header entry: "name": {"dtype": ..., "shape": ..., "data_offsets": [b, e]}.
#define E(name, dtype, shape, b, e) \
    "\"" name "\":{\"dtype\":\"" dtype "\",\"shape\":" shape ",\"data_offsets\":[" #b "," #e "]}"
#define ONE_F32 "{" E("w", "F32", "[2]", 0, 8) "}"
#define HLEN_TEXT UINT64_MAX // header length field = strlen(header)

typedef struct {
    const char *label;
    const char *header; // header text
    uint64_t hlen;      // the header length field; HLEN_TEXT: the text's length
    size_t data_len;    // zero bytes after the header
    size_t cut;         // bytes removed from the end of the file
    const char *expect; // the error message must contain this
} corrupt_case;

static const corrupt_case CORRUPT[] = {
    {"file shorter than 8 bytes", "", 0, 0, 3, "shorter than the 8-byte header length"},
    {"file cut in the data", ONE_F32, HLEN_TEXT, 8, 4, "end 8 is beyond the data section (4 bytes)"},
    {"header length 0", "", 0, 8, 0, "header length is 0"},
    {"header length past the end", ONE_F32, 1000, 8, 0, "runs past the end of the file"},
    {"header length > 100 MB", ONE_F32, 200u << 20, 8, 0, "exceeds the limit"},
    {"invalid JSON", "{\"w\":{\"dtype\":\"F32\",", HLEN_TEXT, 0, 0, "header is not valid JSON"},
    {"trailing garbage", "{} x", HLEN_TEXT, 0, 0, "header is not valid JSON"},
    {"header not an object", "[1, 2]", HLEN_TEXT, 0, 0, "header is not a JSON object"},
    {"entry not an object", "{\"w\": 3}", HLEN_TEXT, 0, 0, "tensor 'w': entry is not an object"},
    {"unknown dtype", "{" E("w", "Q4_K", "[8]", 0, 8) "}", HLEN_TEXT, 8, 0, "tensor 'w': unknown dtype 'Q4_K'"},
    {"unsupported dtype U8", "{" E("w", "U8", "[8]", 0, 8) "}", HLEN_TEXT, 8, 0, "dtype U8 of tensor 'w' is not supported"},
    {"unsupported dtype F8_E4M3", "{" E("w", "F8_E4M3", "[8]", 0, 8) "}", HLEN_TEXT, 8, 0,
     "dtype F8_E4M3 of tensor 'w' is not supported"},
    {"unsupported dtype BOOL", "{" E("w", "BOOL", "[8]", 0, 8) "}", HLEN_TEXT, 8, 0, "dtype BOOL of tensor 'w' is not supported"},
    {"bytes after the last tensor", ONE_F32, HLEN_TEXT, 12, 0, "file not fully covered"},
    {"no tensors, some data", "{}", HLEN_TEXT, 4, 0, "file not fully covered"},
    {"gap before the first tensor", "{" E("w", "F32", "[2]", 4, 12) "}", HLEN_TEXT, 12, 0, "(a gap)"},
    {"gap between tensors", "{" E("a", "F32", "[1]", 0, 4) "," E("b", "F32", "[1]", 8, 12) "}", HLEN_TEXT, 12, 0,
     "tensor 'b' starts at byte 8 of the data section, 4 bytes after"},
    {"escaped NUL in a name", "{" E("a\\u0000b", "F32", "[2]", 0, 8) "}", HLEN_TEXT, 8, 0, "holds a NUL (\\u0000)"},
    {"escaped NUL in a dtype", "{" E("w", "F32\\u0000x", "[2]", 0, 8) "}", HLEN_TEXT, 8, 0, "holds a NUL (\\u0000)"},
    {"raw control byte in a name", "{" E("a\tb", "F32", "[2]", 0, 8) "}", HLEN_TEXT, 8, 0, "control byte 0x09"},
    {"offsets out of range", "{" E("w", "F32", "[4]", 0, 16) "}", HLEN_TEXT, 8, 0, "beyond the data section"},
    {"begin > end", "{" E("w", "F32", "[2]", 8, 0) "}", HLEN_TEXT, 8, 0, "begin 8 > end 0"},
    {"offsets not integers", "{" E("w", "F32", "[2]", 0.5, 8) "}", HLEN_TEXT, 8, 0, "data_offsets is not two"},
    {"overlapping offsets", "{" E("a", "F32", "[2]", 0, 8) "," E("b", "F32", "[2]", 4, 12) "}", HLEN_TEXT, 12,
     0, "tensors 'a' and 'b' overlap"},
    {"dtype/size mismatch", "{" E("w", "F32", "[3]", 0, 8) "}", HLEN_TEXT, 8, 0, "span 8 bytes, F32 x shape needs 12"},
    {"shape product overflows", "{" E("w", "F32", "[4294967296,4294967296,4294967296]", 0, 8) "}", HLEN_TEXT, 8,
     0, "overflows"},
    {"negative shape", "{" E("w", "F32", "[-2]", 0, 8) "}", HLEN_TEXT, 8, 0, "shape[0] is not a non-negative"},
    {"shape not an array", "{" E("w", "F32", "2", 0, 8) "}", HLEN_TEXT, 8, 0, "shape is missing or not an array"},
    {"too many dims", "{" E("w", "F32", "[1,1,1,1,1,1,1,1,2]", 0, 8) "}", HLEN_TEXT, 8, 0, "9 dims, more than 8"},
    {"duplicate names", "{" E("a", "F32", "[2]", 0, 8) "," E("a", "F32", "[2]", 8, 16) "}", HLEN_TEXT, 16, 0,
     "duplicate tensor name 'a'"},
    {"metadata not strings", "{\"__metadata__\": {\"k\": 1}}", HLEN_TEXT, 0, 0, "__metadata__ value 'k'"},
};
#define N_CORRUPT (int)(sizeof CORRUPT / sizeof CORRUPT[0])

// Parameters are indices into CORRUPT: plain ints survive Criterion's worker processes.
ParameterizedTestParameters(safetensors, corrupt) {
    static int idx[N_CORRUPT];
    for (int i = 0; i < N_CORRUPT; i++) idx[i] = i;
    return cr_make_param_array(int, idx, N_CORRUPT);
}

ParameterizedTest(int *i, safetensors, corrupt) {
    const corrupt_case *c = &CORRUPT[*i];
    char path[256];
    tmp_path(path, "corrupt.safetensors");
    write_raw(path, c->hlen == HLEN_TEXT ? strlen(c->header) : c->hlen, c->header, c->data_len, c->cut);
    sd_st_file f;
    sd_status st = {0};
    cr_assert_eq(sd_st_open(path, &f, &st), SD_ERR_DATA, "%s: got code %d: %s", c->label, st.code, st.msg);
    cr_assert(strstr(st.msg, c->expect), "%s: message '%s' lacks '%s'", c->label, st.msg, c->expect);
    cr_assert(strstr(st.msg, path), "%s: message '%s' lacks the path", c->label, st.msg);
    cr_assert(f.map == NULL && f.tensors == NULL && f.n == 0, "%s: not left closed", c->label);
    sd_st_close(&f);
}

// A header listing more tensors than SD_ST_MAX_TENSORS is refused by the pass that counts them,
// before cJSON builds a tree of them (the timeout catches a parse of all of them).
Test(safetensors, huge_tensor_count_refused_before_parsing, .timeout = 10) {
    const size_t n = SD_ST_MAX_TENSORS + 1000;
    size_t cap = n * 64 + 16, len = 0;
    char *hdr = malloc(cap);
    hdr[len++] = '{';
    for (size_t i = 0; i < n; i++)
        len += (size_t)snprintf(hdr + len, cap - len, "%s\"t%zu\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}",
                                i ? "," : "", i);
    hdr[len++] = '}';
    hdr[len] = '\0';
    char path[256];
    tmp_path(path, "many.safetensors");
    write_raw(path, len, hdr, 0, 0);
    free(hdr);
    sd_st_file f;
    sd_status st = {0};
    cr_assert_eq(sd_st_open(path, &f, &st), SD_ERR_DATA, "%s", st.msg);
    cr_assert(strstr(st.msg, "more than the limit of 262144"), "%s", st.msg);
}

// Names are exact: a name that is a prefix of another finds only itself.
Test(safetensors, names_compare_whole) {
    static const float v[2] = {1, 2};
    const sd_st_tensor t[2] = {
        {.name = "ab", .dtype = SD_DT_F32, .ndim = 1, .shape = {1}, .data = v, .nbytes = 4},
        {.name = "a", .dtype = SD_DT_F32, .ndim = 1, .shape = {1}, .data = v + 1, .nbytes = 4},
    };
    char path[256];
    tmp_path(path, "names.safetensors");
    sd_status st = {0};
    cr_assert_eq(sd_st_write(path, t, 2, &st), SD_OK, "%s", st.msg);
    sd_st_file f;
    cr_assert_eq(sd_st_open(path, &f, &st), SD_OK, "%s", st.msg);
    const sd_st_tensor *a = sd_st_find(&f, "a"), *ab = sd_st_find(&f, "ab");
    cr_assert(a && ab && a != ab);
    float got;
    memcpy(&got, a->data, 4);
    cr_assert_eq(got, 2.0f);
    cr_assert_null(sd_st_find(&f, "abc"));
    sd_st_close(&f);
}

Test(safetensors, missing_file_is_sys_error) {
    char path[256];
    tmp_path(path, "absent.safetensors");
    sd_st_file f;
    sd_status st = {0};
    cr_assert_eq(sd_st_open(path, &f, &st), SD_ERR_SYS);
    cr_assert(strstr(st.msg, path), "%s", st.msg);
}

// ---------------------------------------------------------------------------------------------
// sha256

Test(digest, known_answers) {
    char hex[65];
    sd_sha256_buf("", 0, hex);
    cr_assert_str_eq(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    sd_sha256_buf("abc", 3, hex);
    cr_assert_str_eq(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

Test(digest, file_equals_buffer, .init = make_tmpdir, .fini = remove_tmpdir) {
    size_t n = (3u << 20) + 123; // spans several read chunks and ends mid-chunk
    unsigned char *buf = malloc(n);
    uint32_t x = 2463534242u;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        buf[i] = (unsigned char)x;
    }
    char path[256];
    tmp_path(path, "blob");
    FILE *fp = fopen(path, "wb");
    cr_assert_eq(fwrite(buf, 1, n, fp), n);
    fclose(fp);
    char from_file[65], from_buf[65];
    sd_status st = {0};
    cr_assert_eq(sd_sha256_file(path, from_file, &st), SD_OK, "%s", st.msg);
    sd_sha256_buf(buf, n, from_buf);
    cr_assert_str_eq(from_file, from_buf);
    free(buf);
}

Test(digest, missing_file_is_sys_error) {
    char hex[65];
    sd_status st = {0};
    cr_assert_eq(sd_sha256_file("/nonexistent/specdec/blob", hex, &st), SD_ERR_SYS);
    cr_assert(strstr(st.msg, "/nonexistent/specdec/blob"), "%s", st.msg);
}
