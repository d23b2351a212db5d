"""Fold-in: factors for users (or items) that were not in training, without retraining.

For a new user u with ratings r_j on known items j, the factor row is the ridge solution
against the fixed item factors Q_J:

    p_u = argmin_p Σ_j (r_j − p·q_j)² + λ·n_u·|p|²  =  (Q_Jᵀ Q_J + λ n_u I)⁻¹ Q_Jᵀ r

(the SGD objective applies λ once per rating, so a row with n_u ratings carries λ·n_u). Items
fold in the same way against P. Ratings on items (users) the model does not know are ignored;
a user with none keeps the training mean as its prediction.
"""

from __future__ import annotations

import numpy as np

from .. import _native
from ..errors import InvalidArgumentError


def fold_in(model: "_native.MfModel", users, items, ratings, lam: float, side: str = "user"):
    """A new native model: ``model`` with the rows of ``side`` ("user" or "item") that
    ``users``/``items``/``ratings`` rate solved by ridge regression (rows the model already
    knows are solved again from these ratings alone). Returns (model, stats)."""
    if side not in ("user", "item"):
        raise InvalidArgumentError(f"side must be 'user' or 'item', got {side!r}")
    u = np.ascontiguousarray(users, dtype=np.int64)
    i = np.ascontiguousarray(items, dtype=np.int64)
    r = np.ascontiguousarray(ratings, dtype=np.float64)
    if not (len(u) == len(i) == len(r)):
        raise InvalidArgumentError(f"users, items and ratings differ in length ({len(u)}, {len(i)}, {len(r)})")
    if not np.isfinite(r).all():
        raise InvalidArgumentError("ratings must be finite")
    if not lam >= 0:
        raise InvalidArgumentError(f"lam must be >= 0, got {lam}")
    p, q, uid, iid, mean, ku, ki = model.parts()
    k = model.k
    P = np.frombuffer(p, np.float32).reshape(-1, k)
    Q = np.frombuffer(q, np.float32).reshape(-1, k)
    uid, iid = np.frombuffer(uid, np.int64), np.frombuffer(iid, np.int64)
    ku, ki = np.frombuffer(ku, np.uint8).astype(bool), np.frombuffer(ki, np.uint8).astype(bool)
    if side == "item":  # the same solve with the roles swapped
        u, i, P, Q, uid, iid, ku, ki = i, u, Q, P, iid, uid, ki, ku
    # Rows of the fixed side: the ratings on ids it does not know are dropped.
    fixed_pos = {int(x): n for n, x in enumerate(iid)}
    col = np.fromiter((fixed_pos.get(int(x), -1) for x in i), np.int64, len(i))
    ok = col >= 0
    ok[ok] = ki[col[ok]]
    u, col, r = u[ok], col[ok], r[ok]
    new_ids, row = np.unique(u, return_inverse=True)
    F = Q[col].astype(np.float64)
    # Per row: A = Σ q qᵀ + λ n I, b = Σ r q (grouped sums over the sorted rows).
    A = np.zeros((len(new_ids), k, k))
    np.add.at(A, row, F[:, :, None] * F[:, None, :])
    b = np.zeros((len(new_ids), k))
    np.add.at(b, row, F * r[:, None])
    n = np.bincount(row, minlength=len(new_ids)).astype(np.float64)
    A += (lam * n)[:, None, None] * np.eye(k)
    X = np.linalg.solve(A, b[:, :, None])[:, :, 0].astype(np.float32) if len(new_ids) else np.zeros((0, k), np.float32)
    # Grow (or overwrite) the rows of the solved side.
    pos = {int(x): n for n, x in enumerate(uid)}
    P2, uid2, ku2 = P.copy(), uid.copy(), ku.copy()
    extra = [x for x in new_ids.tolist() if x not in pos]
    if extra:
        P2 = np.concatenate([P2, np.zeros((len(extra), k), np.float32)])
        uid2 = np.concatenate([uid2, np.array(extra, np.int64)])
        ku2 = np.concatenate([ku2, np.zeros(len(extra), bool)])
        for n, x in enumerate(extra):
            pos[x] = len(uid) + n
    rows = np.array([pos[x] for x in new_ids.tolist()], np.int64)
    P2[rows] = X
    ku2[rows] = True
    if side == "item":
        P2, Q, uid2, iid, ku2, ki = Q, P2, iid, uid2, ki, ku2
    out = _native.MfModel.from_parts(k, np.ascontiguousarray(P2).tobytes(), np.ascontiguousarray(Q).tobytes(),
                                     uid2.tobytes(), iid.tobytes(), float(mean), ku2.astype(np.uint8).tobytes(),
                                     ki.astype(np.uint8).tobytes())
    stats = {"side": side, "rows": int(len(new_ids)), "new_rows": len(extra), "ratings_used": int(len(r)),
             "ratings_ignored": int((~ok).sum())}
    return out, stats
