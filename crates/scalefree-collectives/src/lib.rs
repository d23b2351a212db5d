//! Dense collectives.
