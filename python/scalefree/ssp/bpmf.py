"""Bayesian probabilistic matrix factorization (Gibbs sampling) on the stale-synchronous
allreduce, as in the SSP paper's section 4.5.

Users and items are split over ranks; a rank samples the latent vectors of its own users
and items. Two reductions carry what the conditionals need from other ranks:

* ``L`` — per item, the sufficient statistics of the users who rated it
  (``Σ u uᵀ`` and ``Σ r u``), plus ``Σ u`` and ``Σ u uᵀ`` over all users for the user
  hyperparameters; each rank contributes the change of its own users' statistics.
* ``R`` — the item vectors; each rank contributes the change of its own items.

Every shard of a result must hold the same set of contributions (an item's statistics are
meaningless mixed from two iterations), so BPMF uses a consistent variant (``sharded`` or
``sharded_thread``); an inconsistent one is refused.
"""

from __future__ import annotations

import time

import numpy as np

from .mf import load_ratings


def _sample_normal_wishart(rng, X_sum, XX_sum, n, k, beta0=2.0):
    """(mu, Lambda) from the Normal-Wishart posterior given Σx, Σxxᵀ over n vectors
    (prior mu0 = 0, beta0, nu0 = k, W0 = I)."""
    from scipy.stats import wishart

    n = max(int(n), 1)
    xbar = X_sum / n
    S = XX_sum / n - np.outer(xbar, xbar)
    beta = beta0 + n
    mu0 = n * xbar / beta
    Winv = np.eye(k) + n * S + beta0 * n / beta * np.outer(xbar, xbar)
    Winv = (Winv + Winv.T) / 2
    W = np.linalg.inv(Winv)
    W = (W + W.T) / 2
    Lam = wishart.rvs(df=k + n, scale=W, random_state=rng)
    Lam = np.atleast_2d(Lam)
    mu = rng.multivariate_normal(mu0, np.linalg.inv(beta * Lam))
    return mu, Lam


def _sample_rows(rng, prec_rows, lin_rows, mu, Lam, alpha):
    """Samples every row i from N(m_i, P_i⁻¹) with P_i = Λ + α·prec_rows[i] and
    m_i = P_i⁻¹ (α·lin_rows[i] + Λμ), batched."""
    n, k = lin_rows.shape
    P = Lam[None, :, :] + alpha * prec_rows.reshape(n, k, k)
    b = alpha * lin_rows + (Lam @ mu)[None, :]
    L = np.linalg.cholesky(P)
    m = np.linalg.solve(P, b[:, :, None])[:, :, 0]
    z = rng.standard_normal((n, k))
    # x = m + L^{-T} z has covariance P^{-1}.
    x = m + np.linalg.solve(np.transpose(L, (0, 2, 1)), z[:, :, None])[:, :, 0]
    return x


def train(group, path, *, k: int = 10, iters: int = 40, slack: int = 0, variant: str = "sharded_thread",
          straggler_ms: float = 0.0, alpha: float = 2.0, burn_in: int = 5, seed: int = 0,
          test_fraction: float = 0.1, checkpoints=None) -> dict:
    """BPMF by Gibbs sampling on the SSP reduction (module docstring). ``checkpoints``: a
    :class:`~scalefree.checkpoint.Checkpoints` counting iterations; at a checkpoint the ranks
    flush both reductions into base sums and start new ones from zero (as
    :func:`scalefree.ssp.mf.train` does), and each rank saves its samples, sums and RNG, so a
    resumed run continues with the uninterrupted run's arithmetic (bit-identical with
    ``variant="sharded"`` at slack 0). Returns ``{"stopped": True, ...}`` when it stopped at
    the checkpoints' ``stop_after``."""
    import json

    import scipy.sparse as sp

    from .straggler import StragglerSchedule

    if variant not in ("sharded", "sharded_thread"):
        raise ValueError(f"BPMF needs a consistent SSP variant (sharded or sharded_thread), not {variant!r}")
    u, i, r = load_ratings(path)
    nU, nI = int(u.max()) + 1, int(i.max()) + 1
    perm = np.random.default_rng(seed).permutation(len(r))
    n_test = int(len(r) * test_fraction)
    test, trn = perm[:n_test], perm[n_test:]
    mean = float(r[trn].mean())
    n, me = group.size, group.rank
    user_owner = np.random.default_rng(seed + 1).integers(0, n, nU)
    item_owner = np.random.default_rng(seed + 2).integers(0, n, nI)
    my_users = np.flatnonzero(user_owner == me)
    my_items = np.flatnonzero(item_owner == me)
    # Ratings of my users (for U and for my share of the item statistics) and of my items.
    sel = trn[user_owner[u[trn]] == me]
    Ru = sp.csr_matrix((r[sel] - mean, (u[sel], i[sel])), shape=(nU, nI))
    Bu = sp.csr_matrix((np.ones(len(sel)), (u[sel], i[sel])), shape=(nU, nI))
    RuT, BuT = Ru.T.tocsr(), Bu.T.tocsr()
    tsel = test[user_owner[u[test]] == me]
    tu, ti, tr = u[tsel], i[tsel], r[tsel]
    kk = k * k
    L_len = nI * (kk + k) + k + kk
    red_L = group.ssp_reduction(L_len, "float64", variant=variant)
    red_R = group.ssp_reduction(nI * k, "float64", variant=variant)
    rng = np.random.default_rng(seed + 100 + me)
    U = np.zeros((nU, k))
    U[my_users] = rng.standard_normal((len(my_users), k)) * 0.1
    V_mine = np.zeros((nI, k))
    V_mine[my_items] = rng.standard_normal((len(my_items), k)) * 0.1
    prev_L = np.zeros(L_len)
    contrib = np.empty(L_len)
    delays = StragglerSchedule(straggler_ms, seed, n).delays_s(me, iters)
    pred_sum = np.zeros(len(tr))
    history = []
    base_L = base_V = None  # the flushed sums at the last checkpoint (the reductions hold what came after)
    start, saved = (0, None) if checkpoints is None else checkpoints.restore()
    if saved is None:
        # Publish the initial item vectors (exact: everyone waits for everyone once).
        V = red_R.allreduce(V_mine.ravel().copy(), slack=0).reshape(nI, k)
    else:
        if saved["U"].shape != U.shape or saved["pred_sum"].shape != pred_sum.shape:
            from ..errors import InvalidArgumentError

            raise InvalidArgumentError("checkpoint does not fit this data's users, items, test share and k")
        U, V_mine, V, prev_L, L = saved["U"], saved["V_mine"], saved["V"], saved["prev_L"], saved["L"]
        pred_sum, base_L, base_V = saved["pred_sum"], saved["base_L"], saved["base_V"]
        rng.bit_generator.state = json.loads(saved["rng"].tobytes().decode())
        history = [(float(a), int(b), float(c), int(d)) for a, b, c, d in saved["history"]]

    def rebase() -> dict:
        """Collective: both reductions' exact sums into the base sums, new reductions from zero."""
        nonlocal red_L, red_R, base_L, base_V
        total_L, total_V = red_L.flush(), red_R.flush()
        base_L = total_L if base_L is None else base_L + total_L
        base_V = total_V if base_V is None else base_V + total_V
        red_L.close()
        red_R.close()
        red_L = group.ssp_reduction(L_len, "float64", variant=variant)
        red_R = group.ssp_reduction(nI * k, "float64", variant=variant)
        return {"U": U, "V_mine": V_mine, "V": V, "prev_L": prev_L, "L": L, "pred_sum": pred_sum, "base_L": base_L,
                "base_V": base_V, "rng": np.frombuffer(json.dumps(rng.bit_generator.state).encode(), np.uint8),
                "history": np.array(history, np.float64).reshape(-1, 4)}

    group.barrier()
    t0 = time.perf_counter()
    for it in range(start, iters):
        if delays[it]:
            time.sleep(delays[it])
        # Users: hyperparameters from the global user statistics, then my users given V.
        Lview = prev_L if it == 0 else L
        tail = Lview[nI * (kk + k):] if it > 0 else None
        if tail is None:
            muU, LamU = np.zeros(k), np.eye(k) * 2.0
        else:
            muU, LamU = _sample_normal_wishart(rng, tail[:k], tail[k:].reshape(k, k), nU, k)
        VV = np.einsum("ij,ik->ijk", V, V).reshape(nI, kk)
        prec = (Bu[my_users] @ VV)
        lin = Ru[my_users] @ V
        U[my_users] = _sample_rows(rng, prec, lin, muU, LamU, alpha)
        # My users' share of every item's statistics, and of the user hyperparameters.
        UU = np.einsum("ij,ik->ijk", U, U).reshape(nU, kk)
        stats = np.empty(L_len)
        stats[: nI * kk] = (BuT @ UU).ravel()
        stats[nI * kk: nI * (kk + k)] = (RuT @ U).ravel()
        stats[nI * (kk + k): nI * (kk + k) + k] = U[my_users].sum(0)
        stats[nI * (kk + k) + k:] = UU[my_users].sum(0)
        np.subtract(stats, prev_L, out=contrib)
        prev_L = stats
        L = red_L.allreduce(contrib, slack=slack)
        if base_L is not None:
            L = base_L + L
        # Items: hyperparameters from the item vectors I see, then my items.
        muV, LamV = _sample_normal_wishart(rng, V.sum(0), V.T @ V, nI, k)
        new = _sample_rows(rng, L[: nI * kk].reshape(nI, kk)[my_items],
                           L[nI * kk: nI * (kk + k)].reshape(nI, k)[my_items], muV, LamV, alpha)
        dV = np.zeros((nI, k))
        dV[my_items] = new - V_mine[my_items]
        V_mine[my_items] = new
        V = red_R.allreduce(dV.ravel(), slack=slack)
        V = (V if base_V is None else base_V + V).reshape(nI, k)
        # Posterior-mean prediction for my users' test ratings.
        pred = mean + np.einsum("ij,ij->i", U[tu], V[ti])
        if it >= burn_in:
            pred_sum += pred
            pred = pred_sum / (it - burn_in + 1)
        sse = float(np.sum((np.clip(pred, 1, 5) - tr) ** 2))
        history.append((time.perf_counter() - t0, it + 1, sse, len(tr)))
        if checkpoints is not None and checkpoints.after(it + 1, rebase):
            red_L.close()
            red_R.close()
            return {"stopped": True, "history": history}
    loop_s = time.perf_counter() - t0
    red_L.flush()
    red_R.flush()
    red_L.close()
    red_R.close()
    return {"history": history, "loop_s": loop_s}
