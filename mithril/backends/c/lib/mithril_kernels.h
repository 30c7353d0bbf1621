/* Mithril's C kernel library: every family, included by each generated translation unit. */
#ifndef MITHRIL_KERNELS_H
#define MITHRIL_KERNELS_H

#include "mt_base.h"
#include "mt_elementwise.h"
#include "mt_convert.h"
#include "mt_gemm.h"
#include "mt_movement.h"
#include "mt_nn.h"
#include "mt_nchwc.h"
#include "mt_attention.h"
#include "mt_linear_attention.h"
#include "mt_misc.h"
#include "mt_quantize.h"
#include "mt_rowwise.h"
#include "mt_recurrent.h"
#include "mt_signal.h"

#endif /* MITHRIL_KERNELS_H */
