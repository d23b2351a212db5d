"""Matrix factorization modes across ranks: a ring of ranks (:mod:`.rima`), a parameter server
(:mod:`.dsgd_ps`), and gradient descent (:mod:`.ssp_gd`) and BPMF (:mod:`.ssp_bpmf`) on the
stale-synchronous allreduce. The one-machine mode and the estimator are :mod:`scalefree.mf.model`."""
