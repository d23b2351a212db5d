//! Python bindings: the only crate that knows PyO3. One file per Python class; every
//! long call releases the GIL; every error kind maps to its own exception class
//! (defined in `scalefree/errors.py`).

mod arena;
mod buffer;
mod device;
mod text_stream;
mod errors;
mod flash;
mod flash_reader;
mod group;
mod ssp;
mod tensors;
mod graph;
mod io;
mod sparse;
mod mf;
mod ucx;
mod xml;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<group::Group>()?;
    m.add_class::<text_stream::PyTextStream>()?;
    m.add_class::<device::PyDevice>()?;
    m.add_class::<device::PyRegion>()?;
    m.add_class::<device::PyRemoteRegion>()?;
    m.add_class::<device::PyChannel>()?;
    m.add_class::<device::PyHelperThread>()?;
    m.add_class::<device::PyCompletion>()?;
    m.add_class::<ssp::PySspReduction>()?;
    m.add_class::<tensors::PyStaticSlot>()?;
    m.add_class::<tensors::PyDynamicChannel>()?;
    m.add_class::<flash::PyFlashRuntime>()?;
    m.add_class::<flash::PyFlashMatrix>()?;
    m.add_class::<flash::PyFlashCsr>()?;
    m.add_class::<flash_reader::PyFlashBlockReader>()?;
    m.add_class::<flash_reader::PyFlashBlock>()?;
    m.add_function(pyo3::wrap_pyfunction!(ucx::ucx_library, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(device::helper_thread_count, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(tensors::sgd_apply, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(arena::_trace_site, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(arena::arena_release_cached, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(arena::_traced_site_count, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(tensors::sgd_apply_to, m)?)?;
    m.add_class::<sparse::PySparseAllreduce>()?;
    m.add_class::<graph::PyPageRankCsr>()?;
    m.add_class::<graph::PyFlashRows>()?;
    m.add_function(pyo3::wrap_pyfunction!(graph::owner_partition, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(graph::sort_dedup_pairs, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(graph::dedup_sorted, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(graph::key_owners, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(graph::scatter_keys, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(graph::sort_dedup_keys, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(graph::dedup_sorted_keys, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(graph::pack_edge_keys, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(graph::keys_id_bound, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(graph::degree_counts, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(graph::degree_order, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(graph::local_ids, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(graph::hadi_union_changed, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(graph::hadi_merge_rows, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(flash::flash_gemm, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(flash::flash_csrgemv, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(flash::flash_csrmm, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(flash::flash_csrtmm, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(flash::memory_csr_product, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(flash::flash_csrcsc, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(flash::flash_kmeans, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(flash::flash_sort_file, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(flash::flash_sort_array, m)?)?;
    m.add_class::<mf::PyMfRatings>()?;
    m.add_class::<mf::PyMfTrainer>()?;
    m.add_class::<mf::PyMfModel>()?;
    m.add_function(pyo3::wrap_pyfunction!(mf::mf_sgd_block, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(mf::mf_read_pairs, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(mf::mf_sgd_entries, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(mf::mf_write_cache, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(mf::mf_cache_header, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(mf::mf_cache_layout, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(mf::mf_split_test_indices, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(mf::mf_cache_path, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(mf::mf_is_cache, m)?)?;
    m.add_class::<xml::PyXmlProgress>()?;
    m.add_function(pyo3::wrap_pyfunction!(xml::xml_model_info, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(xml::xml_import_omikuji, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(xml::xml_write_model, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(xml::xml_concat_models, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(xml::xml_predict, m)?)?;
    m.add_class::<io::PyShareArray>()?;
    m.add_function(pyo3::wrap_pyfunction!(io::read_edges_share, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(io::read_edge_keys_share, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(io::read_svmlight_share, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(io::read_ratings_share, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(io::resolve_parts, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(io::columnar_format, m)?)?;
    m.add_function(pyo3::wrap_pyfunction!(io::read_columnar_share, m)?)?;
    m.add("NOTIFY_SLOTS", scalefree_transport::NOTIFY_SLOTS)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
