/* Mithril C kernels: see mithril/backends/c/ops/quantize.py. */
#ifndef MT_QUANTIZE_H
#define MT_QUANTIZE_H

#include "mt_base.h"

#endif /* MT_QUANTIZE_H */
