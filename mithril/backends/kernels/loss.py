"""Loss kernels: NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss."""

from __future__ import annotations

from ..registry import kernel


def _nll(log_prob, target, weight, ignore_index, reduction, xp):
    """-log_prob[n, target[n, d...], d...] * weight[target], over [N, C, D1, ...] inputs."""
    target = target.astype(xp.int64)
    if ignore_index is None:
        ignored = xp.zeros(target.shape, dtype=bool)
    else:
        ignored = target == ignore_index
    # ignore_index may lie outside [0, C); gather at 0 there and zero the weight.
    safe_target = xp.where(ignored, xp.zeros_like(target), target)
    picked = xp.squeeze(xp.take_along_axis(log_prob, xp.expand_dims(safe_target, 1), axis=1), axis=1)
    if weight is None:
        w = xp.ones(target.shape, dtype=log_prob.dtype)
    else:
        w = xp.take(weight, safe_target).astype(log_prob.dtype)
    w = xp.where(ignored, xp.zeros_like(w), w)
    loss = -picked * w
    if reduction == "none":
        return loss
    total = xp.sum(loss)
    if reduction == "sum":
        return total.astype(log_prob.dtype)
    # mean: weighted by the weights of the targets that count.
    return (total / xp.sum(w)).astype(log_prob.dtype)


@kernel("NegativeLogLikelihoodLoss", since=12)
def negative_log_likelihood_loss(input, target, weight=None, *, ignore_index, reduction, xp):  # noqa: A002
    return _nll(input, target, weight, ignore_index, reduction, xp)


@kernel("SoftmaxCrossEntropyLoss", since=12)
def softmax_cross_entropy_loss(scores, labels, weights=None, *, ignore_index, reduction, xp):
    shifted = scores - xp.max(scores, axis=1, keepdims=True)
    log_prob = shifted - xp.log(xp.sum(xp.exp(shifted), axis=1, keepdims=True))
    return _nll(log_prob, labels, weights, ignore_index, reduction, xp), log_prob
