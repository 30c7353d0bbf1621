/* Mithril C kernels: see mithril/backends/c/ops/attention.py. */
#ifndef MT_ATTENTION_H
#define MT_ATTENTION_H

#include "mt_base.h"

#endif /* MT_ATTENTION_H */
