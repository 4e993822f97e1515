/* Where the forward keeps what the backward reads (the "saved" buffer). */
#include "common/common.h"

/* ---- saved-for-backward ---- */

size_t gdn_saved_bytes(const gdn_config *c) {
    if (!(c->flags & GDN_QK_L2NORM)) return 0;
    return (size_t)(2 * c->B * c->T * c->H) * sizeof(float);
}

gdn_saved_layout gdn_saved_at(const gdn_config *c, void *saved) {
    gdn_saved_layout l = {0};
    if (!saved || !(c->flags & GDN_QK_L2NORM)) return l;
    l.rstd_q = (float *)saved;
    l.rstd_k = l.rstd_q + c->B * c->T * c->H;
    return l;
}
