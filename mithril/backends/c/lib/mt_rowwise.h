/* Mithril C kernels: see mithril/backends/c/ops/rowwise.py. */
#ifndef MT_ROWWISE_H
#define MT_ROWWISE_H

#include "mt_base.h"

#endif /* MT_ROWWISE_H */
