//! The part of UCX's `ucp` C API this backend uses, loaded at run time with `dlopen`.
//!
//! UCX is a run-time dependency, not a build one: the wheel builds and works without it,
//! and a process that already has a `libucp` loaded (mpi4py over UCX, ucx-py) shares that
//! copy instead of loading a second one (two copies in one process fight over memory hooks).
//!
//! Structures are declared as the prefix of the C structure that this code fills, padded to
//! the C size of UCX 1.22 (checked against the headers when this file was written). UCX reads
//! only the fields named in each `field_mask` and only appends fields in newer releases, so
//! the prefix stays valid for every release since the minimum version below.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::sync::OnceLock;

use crate::error::{Error, Result};

pub type ucs_status_t = c_int;
pub type ucp_context_h = *mut c_void;
pub type ucp_worker_h = *mut c_void;
pub type ucp_ep_h = *mut c_void;
pub type ucp_mem_h = *mut c_void;
pub type ucp_rkey_h = *mut c_void;
pub type ucp_config_t = c_void;
pub type ucp_address_t = c_void;
pub type ucs_status_ptr_t = *mut c_void;

pub const UCS_OK: ucs_status_t = 0;
pub const UCS_INPROGRESS: ucs_status_t = 1;
pub const UCS_ERR_BUSY: ucs_status_t = -15;
pub const UCS_ERR_CONNECTION_RESET: ucs_status_t = -25;

/// Oldest UCX with every `*_nbx` call and active-message receive used here.
pub const MIN_VERSION: (u32, u32) = (1, 12);
pub const API_MAJOR: c_uint = 1;
pub const API_MINOR: c_uint = 12;

pub const UCP_PARAM_FIELD_FEATURES: u64 = 1 << 0;
pub const UCP_PARAM_FIELD_MT_WORKERS_SHARED: u64 = 1 << 5;
pub const UCP_PARAM_FIELD_NAME: u64 = 1 << 8;
pub const UCP_FEATURE_RMA: u64 = 1 << 1;
pub const UCP_FEATURE_WAKEUP: u64 = 1 << 4;
pub const UCP_FEATURE_AM: u64 = 1 << 6;

pub const UCP_WORKER_PARAM_FIELD_THREAD_MODE: u64 = 1 << 0;
pub const UCS_THREAD_MODE_MULTI: c_int = 2;
pub const UCP_WORKER_ATTR_FIELD_ADDRESS: u64 = 1 << 1;

pub const UCP_EP_PARAM_FIELD_REMOTE_ADDRESS: u64 = 1 << 0;
pub const UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE: u64 = 1 << 1;
pub const UCP_EP_PARAM_FIELD_ERR_HANDLER: u64 = 1 << 2;
pub const UCP_EP_PARAM_FIELD_USER_DATA: u64 = 1 << 3;
pub const UCP_ERR_HANDLING_MODE_PEER: c_int = 1;
pub const UCP_EP_CLOSE_FLAG_FORCE: u32 = 1 << 0;
pub const UCP_EP_ATTR_FIELD_TRANSPORTS: u64 = 1 << 3;

pub const UCP_MEM_MAP_PARAM_FIELD_ADDRESS: u64 = 1 << 0;
pub const UCP_MEM_MAP_PARAM_FIELD_LENGTH: u64 = 1 << 1;

pub const UCP_OP_ATTR_FIELD_CALLBACK: u32 = 1 << 1;
pub const UCP_OP_ATTR_FIELD_USER_DATA: u32 = 1 << 2;
pub const UCP_OP_ATTR_FIELD_FLAGS: u32 = 1 << 4;
pub const UCP_OP_ATTR_FIELD_MEMH: u32 = 1 << 8;

pub const UCP_AM_HANDLER_PARAM_FIELD_ID: u64 = 1 << 0;
pub const UCP_AM_HANDLER_PARAM_FIELD_FLAGS: u64 = 1 << 1;
pub const UCP_AM_HANDLER_PARAM_FIELD_CB: u64 = 1 << 2;
pub const UCP_AM_HANDLER_PARAM_FIELD_ARG: u64 = 1 << 3;
pub const UCP_AM_FLAG_WHOLE_MSG: u32 = 1 << 0;
pub const UCP_AM_SEND_FLAG_COPY_HEADER: u32 = 1 << 3;
pub const UCP_AM_RECV_ATTR_FLAG_RNDV: u64 = 1 << 17;

pub type SendCb = unsafe extern "C" fn(request: *mut c_void, status: ucs_status_t, user_data: *mut c_void);
pub type RecvDataCb = unsafe extern "C" fn(request: *mut c_void, status: ucs_status_t, length: usize, user_data: *mut c_void);
pub type ErrCb = unsafe extern "C" fn(arg: *mut c_void, ep: ucp_ep_h, status: ucs_status_t);
pub type AmCb = unsafe extern "C" fn(
    arg: *mut c_void,
    header: *const c_void,
    header_length: usize,
    data: *mut c_void,
    length: usize,
    param: *const ucp_am_recv_param_t,
) -> ucs_status_t;

#[repr(C)]
pub struct ucp_params_t {
    pub field_mask: u64,
    pub features: u64,
    pub request_size: usize,
    pub request_init: *mut c_void,
    pub request_cleanup: *mut c_void,
    pub tag_sender_mask: u64,
    pub mt_workers_shared: c_int,
    pub estimated_num_eps: usize,
    pub estimated_num_ppn: usize,
    pub name: *const c_char,
    pub node_local_id: usize,
}

#[repr(C)]
pub struct ucp_worker_params_t {
    pub field_mask: u64,
    pub thread_mode: c_int,
    pub _rest: [u8; 200 - 12],
}

#[repr(C)]
pub struct ucp_worker_attr_t {
    pub field_mask: u64,
    pub thread_mode: c_int,
    pub address_flags: u32,
    pub address: *mut ucp_address_t,
    pub address_length: usize,
    pub _rest: [u8; 80 - 32],
}

#[repr(C)]
pub struct ucp_ep_params_t {
    pub field_mask: u64,
    pub address: *const ucp_address_t,
    pub err_mode: c_int,
    pub err_cb: Option<ErrCb>,
    pub err_arg: *mut c_void,
    pub user_data: *mut c_void,
    pub _rest: [u8; 104 - 48],
}

#[repr(C)]
pub struct ucp_transport_entry_t {
    pub transport_name: *const c_char,
    pub device_name: *const c_char,
}

#[repr(C)]
pub struct ucp_ep_attr_t {
    pub field_mask: u64,
    pub _middle: [u8; 296 - 8],
    pub entries: *mut ucp_transport_entry_t,
    pub num_entries: c_uint,
    pub entry_size: usize,
    pub _rest: [u8; 328 - 320],
}

#[repr(C)]
pub struct ucp_mem_map_params_t {
    pub field_mask: u64,
    pub address: *mut c_void,
    pub length: usize,
    pub flags: c_uint,
    pub prot: c_uint,
    pub _rest: [u8; 48 - 32],
}

#[repr(C)]
pub struct ucp_request_param_t {
    pub op_attr_mask: u32,
    pub flags: u32,
    pub request: *mut c_void,
    /// A union of callback types in C; which one depends on the call.
    pub cb: *const c_void,
    pub datatype: u64,
    pub user_data: *mut c_void,
    pub reply_buffer: *mut c_void,
    pub memory_type: c_int,
    pub recv_info: *mut c_void,
    pub memh: ucp_mem_h,
    pub _rest: [u8; 96 - 72],
}

impl ucp_request_param_t {
    pub fn zeroed() -> Self {
        unsafe { std::mem::zeroed() }
    }
}

#[repr(C)]
pub struct ucp_am_handler_param_t {
    pub field_mask: u64,
    pub id: c_uint,
    pub flags: u32,
    pub cb: Option<AmCb>,
    pub arg: *mut c_void,
}

#[repr(C)]
pub struct ucp_am_recv_param_t {
    pub recv_attr: u64,
    pub reply_ep: ucp_ep_h,
}

const _: () = {
    assert!(std::mem::size_of::<ucp_params_t>() == 88);
    assert!(std::mem::size_of::<ucp_worker_params_t>() == 200);
    assert!(std::mem::size_of::<ucp_worker_attr_t>() == 80);
    assert!(std::mem::size_of::<ucp_ep_params_t>() == 104);
    assert!(std::mem::size_of::<ucp_ep_attr_t>() == 328);
    assert!(std::mem::size_of::<ucp_mem_map_params_t>() == 48);
    assert!(std::mem::size_of::<ucp_request_param_t>() == 96);
    assert!(std::mem::size_of::<ucp_am_handler_param_t>() == 32);
};

/// The entry points, resolved once per process.
#[allow(clippy::type_complexity)]
pub struct Ucp {
    pub path: String,
    pub version: (u32, u32, u32),
    pub get_version: unsafe extern "C" fn(*mut c_uint, *mut c_uint, *mut c_uint),
    pub config_read: unsafe extern "C" fn(*const c_char, *const c_char, *mut *mut ucp_config_t) -> ucs_status_t,
    pub config_release: unsafe extern "C" fn(*mut ucp_config_t),
    pub init_version: unsafe extern "C" fn(c_uint, c_uint, *const ucp_params_t, *const ucp_config_t, *mut ucp_context_h) -> ucs_status_t,
    pub cleanup: unsafe extern "C" fn(ucp_context_h),
    pub worker_create: unsafe extern "C" fn(ucp_context_h, *const ucp_worker_params_t, *mut ucp_worker_h) -> ucs_status_t,
    pub worker_destroy: unsafe extern "C" fn(ucp_worker_h),
    pub worker_query: unsafe extern "C" fn(ucp_worker_h, *mut ucp_worker_attr_t) -> ucs_status_t,
    pub worker_release_address: unsafe extern "C" fn(ucp_worker_h, *mut ucp_address_t),
    pub worker_progress: unsafe extern "C" fn(ucp_worker_h) -> c_uint,
    pub worker_get_efd: unsafe extern "C" fn(ucp_worker_h, *mut c_int) -> ucs_status_t,
    pub worker_arm: unsafe extern "C" fn(ucp_worker_h) -> ucs_status_t,
    pub worker_signal: unsafe extern "C" fn(ucp_worker_h) -> ucs_status_t,
    pub worker_set_am_recv_handler: unsafe extern "C" fn(ucp_worker_h, *const ucp_am_handler_param_t) -> ucs_status_t,
    pub ep_create: unsafe extern "C" fn(ucp_worker_h, *const ucp_ep_params_t, *mut ucp_ep_h) -> ucs_status_t,
    pub ep_close_nbx: unsafe extern "C" fn(ucp_ep_h, *const ucp_request_param_t) -> ucs_status_ptr_t,
    pub ep_query: unsafe extern "C" fn(ucp_ep_h, *mut ucp_ep_attr_t) -> ucs_status_t,
    pub ep_flush_nbx: unsafe extern "C" fn(ucp_ep_h, *const ucp_request_param_t) -> ucs_status_ptr_t,
    pub mem_map: unsafe extern "C" fn(ucp_context_h, *const ucp_mem_map_params_t, *mut ucp_mem_h) -> ucs_status_t,
    pub mem_unmap: unsafe extern "C" fn(ucp_context_h, ucp_mem_h) -> ucs_status_t,
    pub rkey_pack: unsafe extern "C" fn(ucp_context_h, ucp_mem_h, *mut *mut c_void, *mut usize) -> ucs_status_t,
    pub rkey_buffer_release: unsafe extern "C" fn(*mut c_void),
    pub ep_rkey_unpack: unsafe extern "C" fn(ucp_ep_h, *const c_void, *mut ucp_rkey_h) -> ucs_status_t,
    pub rkey_destroy: unsafe extern "C" fn(ucp_rkey_h),
    pub put_nbx: unsafe extern "C" fn(ucp_ep_h, *const c_void, usize, u64, ucp_rkey_h, *const ucp_request_param_t) -> ucs_status_ptr_t,
    pub get_nbx: unsafe extern "C" fn(ucp_ep_h, *mut c_void, usize, u64, ucp_rkey_h, *const ucp_request_param_t) -> ucs_status_ptr_t,
    pub am_send_nbx: unsafe extern "C" fn(ucp_ep_h, c_uint, *const c_void, usize, *const c_void, usize, *const ucp_request_param_t) -> ucs_status_ptr_t,
    pub am_recv_data_nbx: unsafe extern "C" fn(ucp_worker_h, *mut c_void, *mut c_void, usize, *const ucp_request_param_t) -> ucs_status_ptr_t,
    pub am_data_release: unsafe extern "C" fn(ucp_worker_h, *mut c_void),
    pub request_check_status: unsafe extern "C" fn(*mut c_void) -> ucs_status_t,
    pub request_free: unsafe extern "C" fn(*mut c_void),
    status_string: Option<unsafe extern "C" fn(ucs_status_t) -> *const c_char>,
}

unsafe impl Send for Ucp {}
unsafe impl Sync for Ucp {}

/// A `ucs_status_ptr_t` that is an error code rather than a request.
pub fn ptr_is_err(p: ucs_status_ptr_t) -> bool {
    let v = p as isize;
    (-100..0).contains(&v)
}
pub fn ptr_status(p: ucs_status_ptr_t) -> ucs_status_t {
    p as isize as ucs_status_t
}

impl Ucp {
    /// Human-readable name of a status code.
    pub fn status(&self, s: ucs_status_t) -> String {
        match self.status_string {
            Some(f) => unsafe { CStr::from_ptr(f(s)) }.to_string_lossy().into_owned(),
            None => format!("UCX status {s}"),
        }
    }
    pub fn check(&self, s: ucs_status_t, what: &str) -> Result<()> {
        if s == UCS_OK {
            Ok(())
        } else {
            Err(Error::Unsupported(format!("{what}: {}", self.status(s))))
        }
    }
}

static UCP: OnceLock<std::result::Result<Ucp, String>> = OnceLock::new();

/// The loaded library: the copy already in this process if there is one, else the one
/// named by `SCALEFREE_UCX_LIB` (a `libucp.so` file or the folder holding it), else the
/// system's. Errors name every place looked at.
pub fn ucp() -> Result<&'static Ucp> {
    UCP.get_or_init(load).as_ref().map_err(|e| Error::Unsupported(e.clone()))
}

fn dlopen(path: &str, flags: c_int) -> Option<*mut c_void> {
    let c = CString::new(path).ok()?;
    let h = unsafe { libc::dlopen(c.as_ptr(), flags) };
    (!h.is_null()).then_some(h)
}

fn dlerror() -> String {
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        String::new()
    } else {
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

fn load() -> std::result::Result<Ucp, String> {
    let mut tried = Vec::new();
    let mut handle = None;
    // 1. Already loaded by someone else in this process: share it.
    for name in ["libucp.so.0", "libucp.so"] {
        if let Some(h) = dlopen(name, libc::RTLD_NOW | libc::RTLD_NOLOAD) {
            handle = Some((h, format!("{name} (already loaded in this process)")));
            break;
        }
    }
    // 2. SCALEFREE_UCX_LIB: a file or a folder.
    if handle.is_none() {
        if let Some(p) = std::env::var("SCALEFREE_UCX_LIB").ok().map(|p| p.trim().to_string()).filter(|p| !p.is_empty()) {
            let file = if std::path::Path::new(&p).is_dir() { format!("{p}/libucp.so.0") } else { p.clone() };
            match dlopen(&file, libc::RTLD_NOW | libc::RTLD_LOCAL) {
                Some(h) => handle = Some((h, file)),
                None => tried.push(format!("SCALEFREE_UCX_LIB={p}: {}", dlerror())),
            }
        }
    }
    // 3. The system's.
    if handle.is_none() {
        match dlopen("libucp.so.0", libc::RTLD_NOW | libc::RTLD_LOCAL) {
            Some(h) => handle = Some((h, "libucp.so.0 (system)".into())),
            None => tried.push(format!("system libucp.so.0: {}", dlerror())),
        }
    }
    let Some((h, path)) = handle else {
        return Err(format!(
            "UCX is not available (install scalefree[ucx] or a system UCX >= {}.{}); looked at: {}",
            MIN_VERSION.0, MIN_VERSION.1, tried.join("; ")
        ));
    };
    macro_rules! sym {
        ($name:literal) => {{
            let c = CString::new($name).unwrap();
            let p = unsafe { libc::dlsym(h, c.as_ptr()) };
            if p.is_null() {
                return Err(format!("{path} has no symbol {} (UCX too old? need >= {}.{})", $name, MIN_VERSION.0, MIN_VERSION.1));
            }
            // The target type is the field's declared function-pointer type.
            #[allow(clippy::missing_transmute_annotations)]
            let f = unsafe { std::mem::transmute::<*mut c_void, _>(p) };
            f
        }};
    }
    let get_version: unsafe extern "C" fn(*mut c_uint, *mut c_uint, *mut c_uint) = sym!("ucp_get_version");
    let (mut a, mut b, mut c) = (0, 0, 0);
    unsafe { get_version(&mut a, &mut b, &mut c) };
    if (a, b) < MIN_VERSION {
        return Err(format!("{path} is UCX {a}.{b}.{c}; scalefree needs >= {}.{}", MIN_VERSION.0, MIN_VERSION.1));
    }
    // ucs_status_string lives in libucs, which libucp pulls in.
    let status_string = {
        let c = CString::new("ucs_status_string").unwrap();
        let p = unsafe { libc::dlsym(h, c.as_ptr()) };
        (!p.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn(ucs_status_t) -> *const c_char>(p) })
    };
    Ok(Ucp {
        path: path.clone(),
        version: (a, b, c),
        get_version,
        config_read: sym!("ucp_config_read"),
        config_release: sym!("ucp_config_release"),
        init_version: sym!("ucp_init_version"),
        cleanup: sym!("ucp_cleanup"),
        worker_create: sym!("ucp_worker_create"),
        worker_destroy: sym!("ucp_worker_destroy"),
        worker_query: sym!("ucp_worker_query"),
        worker_release_address: sym!("ucp_worker_release_address"),
        worker_progress: sym!("ucp_worker_progress"),
        worker_get_efd: sym!("ucp_worker_get_efd"),
        worker_arm: sym!("ucp_worker_arm"),
        worker_signal: sym!("ucp_worker_signal"),
        worker_set_am_recv_handler: sym!("ucp_worker_set_am_recv_handler"),
        ep_create: sym!("ucp_ep_create"),
        ep_close_nbx: sym!("ucp_ep_close_nbx"),
        ep_query: sym!("ucp_ep_query"),
        ep_flush_nbx: sym!("ucp_ep_flush_nbx"),
        mem_map: sym!("ucp_mem_map"),
        mem_unmap: sym!("ucp_mem_unmap"),
        rkey_pack: sym!("ucp_rkey_pack"),
        rkey_buffer_release: sym!("ucp_rkey_buffer_release"),
        ep_rkey_unpack: sym!("ucp_ep_rkey_unpack"),
        rkey_destroy: sym!("ucp_rkey_destroy"),
        put_nbx: sym!("ucp_put_nbx"),
        get_nbx: sym!("ucp_get_nbx"),
        am_send_nbx: sym!("ucp_am_send_nbx"),
        am_recv_data_nbx: sym!("ucp_am_recv_data_nbx"),
        am_data_release: sym!("ucp_am_data_release"),
        request_check_status: sym!("ucp_request_check_status"),
        request_free: sym!("ucp_request_free"),
        status_string,
    })
}
