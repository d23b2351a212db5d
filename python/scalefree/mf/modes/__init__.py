"""Matrix factorization modes: one machine (:mod:`.local`), a ring of ranks (:mod:`.rima`), a
parameter server (:mod:`.dsgd_ps`), and gradient descent (:mod:`.ssp_gd`) and BPMF
(:mod:`.ssp_bpmf`) on the stale-synchronous allreduce. They train on the data of
:mod:`scalefree.mf.data`; the estimator, :class:`scalefree.mf.MatrixFactorization`
(:mod:`scalefree.mf.model`), picks one."""
