"""Matrix factorization data: rating blocks and the partition (:mod:`.blocks`), each rank's share of
the ratings (:mod:`.shares`), ratings streamed from disk (:mod:`.stream`), preloading under a
memory budget (:mod:`.preload`) and checkpoints (:mod:`.checkpoint`)."""
