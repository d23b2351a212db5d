//! The one-sided "device" API of scalefree (see ARCHITECTURE.md, "The one-sided core").
//!
//! * [`Device`] — a rank's endpoint: `alloc_region`, `register`, `attach`, `channel`,
//!   notification slots (`wait`, `test`).
//! * [`Region`] / [`RegionHandle`] / [`RemoteRegion`] — registered memory and how peers name it.
//! * [`Channel`] — `write`, `read`, `write_notify` to one peer, returning a [`Completion`].
//!
//! Backends implement [`Backend`]: `shm` (one host: memfd regions, cross-memory attach) and
//! `ucx` (several hosts); capabilities such as [`DirectLanding`] are optional. Bootstrap reads the
//! launcher's environment and assembles the ranks of a job.

pub mod arena;
pub mod auth;
pub mod backends;
pub mod bootstrap;
pub mod channel;
pub mod config;
pub mod device;
pub mod error;
pub mod mesh;
pub mod region;
pub mod seal;
pub mod traffic;
pub mod wait;

pub use bootstrap::{JobInfo, Launcher};
pub use arena::{Arena, ArenaOptions, Block};
pub use backends::{Backend, DirectLanding, Reducer, Transport, Window};
pub use channel::{Channel, Completion};
pub use device::{Device, DeviceOptions, NOTIFY_SLOTS};
pub use error::{Error, Result};
pub use region::{Region, RegionHandle, RegionKind, RemoteRegion};
pub use traffic::PeerTraffic;
