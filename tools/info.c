/* pagedattn info: version, backends, what each supports, and the CPU features found. */
#include "tool.h"

#include "pagedattn.h"

#include <stdio.h>
#include <string.h>

static void cpu_features(void)
{
#if defined(__x86_64__) || defined(__i386__)
    printf("cpu features:");
    __builtin_cpu_init();
#define F(name) if (__builtin_cpu_supports(name)) printf(" %s", name);
    F("sse4.2") F("avx") F("avx2") F("fma") F("avx512f") F("avx512bw") F("avx512vl")
#undef F
    printf("\n");
#else
    printf("cpu features: (not x86)\n");
#endif
}

/* A few representative layers: the capability query answers for each. */
static void capabilities(const pa_backend *b)
{
    static const struct {
        const char *what;
        pa_dtype cache;
        pa_attn_type type;
        int window, alibi, softcap, sinks, sparse;
    } probes[] = {
        {"decoder f32", PA_DTYPE_F32, PA_ATTN_DECODER, 0, 0, 0, 0, 0},
        {"bf16 cache", PA_DTYPE_BF16, PA_ATTN_DECODER, 0, 0, 0, 0, 0},
        {"f16 cache", PA_DTYPE_F16, PA_ATTN_DECODER, 0, 0, 0, 0, 0},
        {"fp8 e4m3 cache", PA_DTYPE_FP8_E4M3, PA_ATTN_DECODER, 0, 0, 0, 0, 0},
        {"fp8 e5m2 cache", PA_DTYPE_FP8_E5M2, PA_ATTN_DECODER, 0, 0, 0, 0, 0},
        {"sliding window", PA_DTYPE_F32, PA_ATTN_DECODER, 1, 0, 0, 0, 0},
        {"alibi", PA_DTYPE_F32, PA_ATTN_DECODER, 0, 1, 0, 0, 0},
        {"soft-cap", PA_DTYPE_F32, PA_ATTN_DECODER, 0, 0, 1, 0, 0},
        {"sinks", PA_DTYPE_F32, PA_ATTN_DECODER, 0, 0, 0, 1, 0},
        {"block-sparse", PA_DTYPE_F32, PA_ATTN_DECODER, 0, 0, 0, 0, 1},
        {"encoder", PA_DTYPE_F32, PA_ATTN_ENCODER, 0, 0, 0, 0, 0},
        {"encoder_only", PA_DTYPE_F32, PA_ATTN_ENCODER_ONLY, 0, 0, 0, 0, 0},
        {"encoder_decoder", PA_DTYPE_F32, PA_ATTN_ENCODER_DECODER, 0, 0, 0, 0, 0},
    };
    float per_head[32];
    for (int i = 0; i < 32; i++) per_head[i] = 0.1f;
    for (size_t i = 0; i < sizeof probes / sizeof probes[0]; i++) {
        pa_layer_config cfg;
        pa_layer_config_init(&cfg, 32, 8, 128);
        cfg.cache_dtype = probes[i].cache;
        cfg.attn_type = probes[i].type;
        if (probes[i].window) cfg.sliding_window = 4096;
        if (probes[i].alibi) cfg.alibi_slopes = per_head;
        if (probes[i].softcap) cfg.logits_soft_cap = 30.0f;
        if (probes[i].sinks) cfg.sinks = per_head;
        if (probes[i].sparse) cfg.blocksparse = (pa_blocksparse){64, 16, 8, 0, 1, 0};
        pa_layer *layer = NULL;
        char why[256];
        if (pa_layer_create(&cfg, &layer) != PA_STATUS_OK) continue;
        pa_status s = pa_backend_supports(b, layer, why, sizeof why);
        printf("    %-16s %s%s\n", probes[i].what, s ? "no: " : "yes", s ? why : "");
        pa_layer_destroy(layer);
    }
}

int pa_tool_info(int argc, char **argv)
{
    if (argc > 1) { /* info takes no options */
        if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) return pa_tool_usage(stdout);
        fprintf(stderr, "pagedattn info: takes no options (got %s)\n", argv[1]);
        return pa_tool_usage(stderr);
    }
    printf("pagedattn %s (library %s, header %s)\n", pa_version_string(), pa_version_string(),
           PAGEDATTN_VERSION_STRING);
    cpu_features();
    const pa_backend *chosen = NULL;
    pa_status s = pa_backend_select(NULL, NULL, &chosen);
    printf("default backend: %s\n", s ? pa_last_error() : pa_backend_name(chosen));
    for (int i = 0; i < pa_backend_count(); i++) {
        const pa_backend *b = pa_backend_at(i);
        char why[256];
        int ok = pa_backend_available(b, why, sizeof why);
        printf("\nbackend %s: %s\n  available: %s%s\n", pa_backend_name(b), pa_backend_description(b),
               ok ? "yes" : "no: ", ok ? "" : why);
        printf("  preferred cache layout: %s; memory: %s\n",
               pa_backend_preferred_layout(b) == PA_LAYOUT_NHD ? "NHD" : "HND",
               pa_backend_memory(b) == PA_MEMORY_HOST ? "host" : "cuda device");
        const char *info = pa_backend_info(b);
        for (const char *line = info; line && *line;) { /* indent each line */
            const char *end = strchr(line, '\n');
            int len = end ? (int)(end - line) : (int)strlen(line);
            printf("  %.*s\n", len, line);
            line = end ? end + 1 : line + len;
        }
        printf("  supports (32 q / 8 kv heads x 128):\n");
        capabilities(b);
    }
    return 0;
}
