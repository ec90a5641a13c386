/* RoPE frequency tables for every rope_scaling type transformers defines for the supported
 * families (default, linear, dynamic, llama3, yarn, longrope), over the rotated dims of a head
 * (partial_rotary_factor), computed in double on the host once per model (per step and
 * sequence for dynamic and longrope). */
#include "model/model_internal.h"

#include <math.h>

static double yarn_mscale(double scale, double m) {
    return scale <= 1 ? 1.0 : 0.1 * m * log(scale) + 1.0;
}

/* The dimension index at which a frequency makes `rotations` turns over `ctx` positions. */
static double yarn_correction_dim(double rotations, int dim, double base, double ctx) {
    return dim * log(ctx / (rotations * 2 * M_PI)) / (2 * log(base));
}

static void rope_yarn(const io_model_config *cfg, int dim, double base, float *inv_freq,
                      float *mscale) {
    const io_rope_scaling *rs = &cfg->rope_scaling;
    double orig = rs->original_max_position_embeddings > 0 ? rs->original_max_position_embeddings
                                                           : cfg->max_position_embeddings;
    double factor = rs->factor > 0 ? rs->factor : cfg->max_position_embeddings / orig;
    if (rs->attention_factor > 0)
        *mscale = rs->attention_factor;
    else if (rs->mscale > 0 && rs->mscale_all_dim > 0)
        *mscale =
            (float)(yarn_mscale(factor, rs->mscale) / yarn_mscale(factor, rs->mscale_all_dim));
    else
        *mscale = (float)yarn_mscale(factor, 1.0);
    double beta_fast = rs->beta_fast > 0 ? rs->beta_fast : 32;
    double beta_slow = rs->beta_slow > 0 ? rs->beta_slow : 1;
    double low = yarn_correction_dim(beta_fast, dim, base, orig);
    double high = yarn_correction_dim(beta_slow, dim, base, orig);
    /* GPT-OSS keeps the range fractional (truncate false); the others round it outward. */
    if (rs->truncate) {
        low = floor(low);
        high = ceil(high);
    }
    if (low < 0) low = 0;
    if (high > dim - 1) high = dim - 1;
    if (low == high) high += 0.001;
    for (int i = 0; i < dim / 2; i++) {
        double pos_freq = pow(base, (double)(2 * i) / dim);
        double ramp = ((double)i - low) / (high - low);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        double extrapolation = 1 - ramp;
        inv_freq[i] = (float)((1.0 / (factor * pos_freq)) * (1 - extrapolation) +
                              (1.0 / pos_freq) * extrapolation);
    }
}

static void rope_llama3(const io_rope_scaling *rs, int dim, double base, float *inv_freq) {
    double om = rs->original_max_position_embeddings;
    double lo = rs->low_freq_factor, hi = rs->high_freq_factor, f = rs->factor;
    double low_wl = om / lo, high_wl = om / hi;
    for (int i = 0; i < dim / 2; i++) {
        double freq = 1.0 / pow(base, (double)(2 * i) / dim);
        double wl = 2 * M_PI / freq;
        if (wl < high_wl) {
            inv_freq[i] = (float)freq;
        } else if (wl > low_wl) {
            inv_freq[i] = (float)(freq / f);
        } else {
            double s = (om / wl - lo) / (hi - lo);
            inv_freq[i] = (float)((1 - s) * freq / f + s * freq);
        }
    }
}

/* Phi-3's: the long factors once the sequence passes the pretrained length, as transformers
 * switches per forward call; cos and sin scaled by attention_factor, or by
 * sqrt(1 + ln(factor) / ln(original)) where factor defaults to max / original positions. */
int model_rope_long_after(const io_model_config *cfg) {
    const io_rope_scaling *rs = &cfg->rope_scaling;
    if (rs->type != IO_ROPE_LONGROPE) return 0;
    return rs->original_max_position_embeddings > 0 ? rs->original_max_position_embeddings
                                                    : cfg->max_position_embeddings;
}

static void rope_longrope(const io_model_config *cfg, int dim, double base, int seq_len,
                          float *inv_freq, float *mscale) {
    const io_rope_scaling *rs = &cfg->rope_scaling;
    double orig = model_rope_long_after(cfg);
    double factor = rs->factor > 0 ? rs->factor : cfg->max_position_embeddings / orig;
    if (rs->attention_factor > 0)
        *mscale = rs->attention_factor;
    else
        *mscale = factor <= 1 ? 1.0f : (float)sqrt(1 + log(factor) / log(orig));
    const float *ext = seq_len > orig ? rs->long_factor : rs->short_factor;
    for (int i = 0; i < dim / 2; i++)
        inv_freq[i] = (float)(1.0 / (ext[i] * pow(base, (double)(2 * i) / dim)));
}

bool model_rope_static(const io_rope_scaling *rs) {
    return rs->type != IO_ROPE_DYNAMIC && rs->type != IO_ROPE_LONGROPE;
}

void model_rope_freqs(const io_model_config *cfg, bool local, int seq_len, float *inv_freq,
                      float *mscale) {
    int dim = cfg->rotary_dim;
    *mscale = 1.0f;
    if (local && cfg->rope_local_theta > 0) {
        /* Gemma 3's local layers: their own base; transformers 5 may give them a scaling too,
         * of the types a local table can take. */
        io_model_config lc = *cfg;
        lc.rope_theta = cfg->rope_local_theta;
        lc.rope_scaling = cfg->rope_local_scaling;
        lc.rope_local_theta = 0;
        model_rope_freqs(&lc, false, seq_len, inv_freq, mscale);
        return;
    }
    double base = cfg->rope_theta;
    const io_rope_scaling *rs = &cfg->rope_scaling;
    switch (rs->type) {
    case IO_ROPE_LONGROPE:
        rope_longrope(cfg, dim, base, seq_len, inv_freq, mscale);
        return;
    case IO_ROPE_YARN:
        rope_yarn(cfg, dim, base, inv_freq, mscale);
        return;
    case IO_ROPE_LLAMA3:
        rope_llama3(rs, dim, base, inv_freq);
        return;
    case IO_ROPE_DYNAMIC: {
        double max_pos = cfg->max_position_embeddings;
        double len = seq_len > max_pos ? seq_len : max_pos;
        base *= pow(rs->factor * len / max_pos - (rs->factor - 1), (double)dim / (dim - 2));
        break;
    }
    default:
        break;
    }
    double div = rs->type == IO_ROPE_LINEAR ? rs->factor : 1.0;
    for (int i = 0; i < dim / 2; i++)
        inv_freq[i] = (float)(1.0 / (pow(base, (double)(2 * i) / dim) * div));
}
