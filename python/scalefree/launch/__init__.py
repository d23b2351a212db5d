"""Starting a job: the launcher (:mod:`.launcher`, ``scalefree run``), rank 0's address under
mpirun (:mod:`.mpi_master`), the UCX library (:mod:`.ucx`) and simulated hosts for tests
(:mod:`.simhosts`)."""
