/* registry.c: the built-in backends, lookup and selection. */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>

/* In order of preference: fastest first. */
static const struct pa_backend *const registry[] = {
#ifdef PAGEDATTN_HAVE_CUDA
    &pa__backend_cuda,
#endif
#ifdef PAGEDATTN_HAVE_CPU
    &pa__backend_cpu,
#endif
    &pa__backend_reference,
};
#define REGISTRY_SIZE ((int)(sizeof registry / sizeof registry[0]))

int pa_backend_count(void) { return REGISTRY_SIZE; }

const pa_backend *pa_backend_at(int i) { return i >= 0 && i < REGISTRY_SIZE ? registry[i] : NULL; }

const pa_backend *pa_backend_find(const char *name)
{
    for (int i = 0; name && i < REGISTRY_SIZE; i++)
        if (strcmp(registry[i]->name, name) == 0) return registry[i];
    return NULL;
}

const char *pa_backend_name(const pa_backend *b) { return b ? b->name : NULL; }
const char *pa_backend_description(const pa_backend *b) { return b ? b->description : NULL; }
pa_cache_layout pa_backend_preferred_layout(const pa_backend *b)
{
    return b ? b->preferred_layout : PA_LAYOUT_NHD;
}
pa_memory pa_backend_memory(const pa_backend *b) { return b ? b->memory : PA_MEMORY_HOST; }
/* (a backend's info may fail inner checks on the way, e.g. a bad PAGEDATTN_CPU_ISA it reports:
 * the caller's last error stays as it was, as after every call that succeeds) */
const char *pa_backend_info(const pa_backend *b)
{
    char saved[PA__REASON_MAX];
    snprintf(saved, sizeof saved, "%s", pa_last_error());
    const char *r = b && b->info ? b->info() : "";
    pa__fail(PA_STATUS_OK, "%s", saved);
    return r;
}

int pa_backend_available(const pa_backend *b, char *reason, size_t size)
{
    char buf[256] = "";
    bool ok = b && (!b->available || b->available(buf, sizeof buf));
    if (!b) snprintf(buf, sizeof buf, "backend is NULL");
    if (reason && size) snprintf(reason, size, "%s", ok ? "" : buf);
    return ok;
}

pa_status pa_backend_supports(const pa_backend *b, const pa_layer *layer, char *reason, size_t size)
{
    pa_status s = PA_STATUS_OK;
    if (!b || !layer)
        s = pa__fail(PA_STATUS_NULL_POINTER, "pa_backend_supports: backend and layer must not be NULL");
    else if (b->supports)
        s = b->supports(layer);
    if (reason && size) snprintf(reason, size, "%s", s ? pa_last_error() : "");
    return s;
}

static void list_names(char *buf, size_t size)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < REGISTRY_SIZE && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, "%s%s", i ? ", " : "", registry[i]->name);
}

/* An explicit choice: it must exist, run here and support the layer. */
static pa_status select_named(const char *name, const char *origin, const pa_layer *layer,
                              const pa_backend **out)
{
    const pa_backend *b = pa_backend_find(name);
    char why[256];
    if (!b) {
        list_names(why, sizeof why);
        return pa__fail(PA_STATUS_NOT_FOUND, "%s names backend \"%s\"; built backends: %s", origin,
                        name, why);
    }
    if (!pa_backend_available(b, why, sizeof why))
        return pa__fail(PA_STATUS_UNAVAILABLE, "%s names backend \"%s\", which cannot run here: %s",
                        origin, name, why);
    if (layer && b->supports && b->supports(layer)) {
        snprintf(why, sizeof why, "%s", pa_last_error());
        return pa__fail(PA_STATUS_UNSUPPORTED, "%s names backend \"%s\", which cannot run this layer: %s",
                        origin, name, why);
    }
    *out = b;
    return PA_STATUS_OK;
}

pa_status pa_backend_select(const char *name, const pa_layer *layer, const pa_backend **out)
{
    if (!out) return pa__fail(PA_STATUS_NULL_POINTER, "pa_backend_select: out is NULL");
    *out = NULL;
    if (name && *name) return select_named(name, "the name argument", layer, out);
    const char *env = getenv("PAGEDATTN_BACKEND");
    if (env && *env) return select_named(env, "PAGEDATTN_BACKEND", layer, out);
    char saved[PA__REASON_MAX]; /* (the reasons of the backends passed over are not the caller's) */
    snprintf(saved, sizeof saved, "%s", pa_last_error());
    for (int i = 0; i < REGISTRY_SIZE; i++) {
        const struct pa_backend *b = registry[i];
        if (!pa_backend_available(b, NULL, 0)) continue;
        if (layer && b->supports && b->supports(layer)) continue;
        *out = b;
        pa__fail(PA_STATUS_OK, "%s", saved);
        return PA_STATUS_OK;
    }
    return pa__fail(PA_STATUS_UNSUPPORTED, "no available backend supports this layer");
}
