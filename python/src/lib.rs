//! The native half of the Python package `flash_attn_wgpu` (pyo3): device tensors and the
//! three calls (forward, backward, attention over a KV cache) on one process-wide
//! [`Context`]. The Python half (`flash_attn_wgpu/__init__.py`) gives them flash-attn's names
//! and argument conventions, and converts numpy arrays; this file only maps Python values to
//! the library's types and back. Every call releases the GIL while the GPU works.

use std::sync::OnceLock;

mod distributed;

use flash_attn_wgpu::{
    AttentionConfig, BlockMask, CacheFormat, Context, DType, Dropout, Error, MaskMod, PagedKv,
    QuantizedCache, Rotary, ScoreMod, Tensor, Window,
};
use numpy::{PyArrayMethods, PyReadonlyArrayDyn, PyUntypedArrayMethods, ToPyArray};
use pyo3::prelude::*;
use pyo3::types::PyType;

/// The process's context, created on first use (the default adapter).
static CONTEXT: OnceLock<Context> = OnceLock::new();

fn context(py: Python<'_>) -> PyResult<&'static Context> {
    if let Some(c) = CONTEXT.get() {
        return Ok(c);
    }
    let made = py.detach(Context::new).map_err(|e| to_py(py, e))?;
    // two threads may race here: the loser's context is dropped, both use the winner's
    Ok(CONTEXT.get_or_init(|| made))
}

/// Our error as the Python exception of its kind (classes in `flash_attn_wgpu/_errors.py`),
/// carrying our message.
fn to_py(py: Python<'_>, e: Error) -> PyErr {
    let kind = match &e {
        Error::SliceLength { .. }
        | Error::Shape { .. }
        | Error::DType { .. }
        | Error::ForeignTensor { .. }
        | Error::InvalidValue { .. }
        | Error::InvalidConfig(_)
        | Error::Buffer { .. }
        | Error::UserCode { .. } => "InvalidInputError",
        Error::Unsupported { .. } | Error::DeviceLimit { .. } => "UnsupportedError",
        Error::OutOfMemory(_) => "OutOfMemoryError",
        _ => "FlashAttnError",
    };
    let class = py
        .import("flash_attn_wgpu._errors")
        .and_then(|m| m.getattr(kind))
        .and_then(|c| Ok(c.cast_into::<PyType>()?));
    match class {
        Ok(c) => PyErr::from_type(c, e.to_string()),
        Err(import_failed) => import_failed,
    }
}

fn invalid(py: Python<'_>, msg: String) -> PyErr {
    to_py(py, Error::InvalidConfig(msg))
}

/// A tensor in GPU memory: upload once, chain calls, download once.
#[pyclass(name = "Tensor", module = "flash_attn_wgpu._native")]
struct PyTensor {
    inner: Tensor,
}

fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "float32",
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
    }
}

#[pymethods]
impl PyTensor {
    /// The shape, row-major.
    #[getter]
    fn shape(&self) -> Vec<usize> {
        self.inner.shape().to_vec()
    }

    /// "float32", "float16" or "bfloat16".
    #[getter]
    fn dtype(&self) -> &'static str {
        dtype_name(self.inner.dtype())
    }

    /// The values: a float32 array, or for the half dtypes their bits as uint16 (the Python
    /// side views them as float16 or bfloat16).
    fn download<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let ctx = context(py)?;
        let t = &self.inner;
        let shape = t.shape().to_vec();
        let arr = match t.dtype() {
            DType::F32 => {
                let v = py
                    .detach(|| ctx.download::<f32>(t))
                    .map_err(|e| to_py(py, e))?;
                v.to_pyarray(py).reshape(shape)?.into_any()
            }
            DType::F16 => {
                let v = py
                    .detach(|| ctx.download::<half::f16>(t))
                    .map_err(|e| to_py(py, e))?;
                bits(&v).to_pyarray(py).reshape(shape)?.into_any()
            }
            DType::BF16 => {
                let v = py
                    .detach(|| ctx.download::<half::bf16>(t))
                    .map_err(|e| to_py(py, e))?;
                bits(&v).to_pyarray(py).reshape(shape)?.into_any()
            }
        };
        Ok(arr)
    }

    fn __repr__(&self) -> String {
        format!(
            "flash_attn_wgpu.Tensor(shape={:?}, dtype={})",
            self.inner.shape(),
            dtype_name(self.inner.dtype())
        )
    }
}

fn bits<T: bytemuck::Pod>(v: &[T]) -> &[u16] {
    bytemuck::cast_slice(v)
}

/// A new device tensor from a C-contiguous array: float32 values, or float16/bfloat16 bits
/// as uint16 with `dtype` naming which.
#[pyfunction]
fn upload(py: Python<'_>, array: &Bound<'_, PyAny>, dtype: &str) -> PyResult<PyTensor> {
    let ctx = context(py)?;
    let made = match dtype {
        "float32" => {
            let a: PyReadonlyArrayDyn<'_, f32> = array.extract()?;
            let shape = a.shape().to_vec();
            let data = a.as_slice()?;
            py.detach(|| ctx.upload(data, &shape))
        }
        "float16" | "bfloat16" => {
            let a: PyReadonlyArrayDyn<'_, u16> = array.extract()?;
            let shape = a.shape().to_vec();
            let data = a.as_slice()?;
            if dtype == "float16" {
                let h: &[half::f16] = bytemuck::cast_slice(data);
                py.detach(|| ctx.upload(h, &shape))
            } else {
                let h: &[half::bf16] = bytemuck::cast_slice(data);
                py.detach(|| ctx.upload(h, &shape))
            }
        }
        other => {
            return Err(invalid(
                py,
                format!("upload: dtype must be float32, float16 or bfloat16, got {other}"),
            ))
        }
    };
    made.map(|inner| PyTensor { inner })
        .map_err(|e| to_py(py, e))
}

/// The name and driver of the adapter in use.
#[pyfunction]
fn adapter(py: Python<'_>) -> PyResult<String> {
    let a = context(py)?.adapter_info();
    Ok(format!(
        "{} ({}, {} {})",
        a.name, a.backend, a.driver, a.driver_info
    ))
}

/// The call's options, as the Python side passes them (every key present).
#[derive(FromPyObject)]
struct Options {
    #[pyo3(item)]
    causal: bool,
    #[pyo3(item)]
    softmax_scale: Option<f32>,
    #[pyo3(item)]
    window_size: (i64, i64),
    #[pyo3(item)]
    softcap: f32,
    #[pyo3(item)]
    alibi_slopes: Option<Vec<f32>>,
    #[pyo3(item)]
    dropout_p: f32,
    #[pyo3(item)]
    seed: u64,
    #[pyo3(item)]
    cu_seqlens_q: Option<Vec<u32>>,
    #[pyo3(item)]
    cu_seqlens_k: Option<Vec<u32>>,
    /// The block table, flattened, and its pages per sequence.
    #[pyo3(item)]
    block_table: Option<(Vec<u32>, usize)>,
    #[pyo3(item)]
    num_splits: usize,
    /// Per-batch left padding of the keys (flash-attn's `cache_leftpad`).
    #[pyo3(item)]
    leftpad_k: Option<Vec<usize>>,
    /// A user score modifier's WGSL (`ScoreMod`), and its captured tensors by name.
    #[pyo3(item)]
    score_mod: Option<String>,
    #[pyo3(item)]
    score_mod_tensors: Vec<(String, Vec<f32>)>,
    /// The captured tensor of `score_mod` whose gradient the backward returns
    /// (`ScoreMod::with_trainable`).
    #[pyo3(item)]
    score_mod_trainable: Option<String>,
    /// A user mask's WGSL (`MaskMod`), and its captured tensors by name.
    #[pyo3(item)]
    mask_mod: Option<String>,
    #[pyo3(item)]
    mask_mod_tensors: Vec<(String, Vec<f32>)>,
    /// The mask's block mask (`create_block_mask`).
    #[pyo3(item)]
    block_mask: Option<Py<PyBlockMask>>,
}

/// A user mask's block mask (`Context::create_block_mask`): the blocks the mask hides are
/// never visited, those it keeps whole skip its evaluation.
#[pyclass(name = "BlockMask", module = "flash_attn_wgpu._native", frozen)]
struct PyBlockMask {
    inner: BlockMask,
    /// The mask it was made from (WGSL and captured tensors), which a call with this block
    /// mask applies: its full blocks are that mask's.
    mask_mod: String,
    mask_mod_tensors: Vec<(String, Vec<f32>)>,
}

#[pymethods]
impl PyBlockMask {
    /// (block_q, block_kv): query rows and keys per block.
    #[getter]
    fn block_size(&self) -> (usize, usize) {
        (self.inner.block_q, self.inner.block_kv)
    }

    /// The mask's WGSL, which the block mask was made from and a call with it applies.
    #[getter]
    fn mask_mod(&self) -> String {
        self.mask_mod.clone()
    }

    /// The mask's captured tensors, as (name, values) pairs.
    #[getter]
    fn mask_mod_tensors(&self) -> Vec<(String, Vec<f32>)> {
        self.mask_mod_tensors.clone()
    }

    /// (blocks on, blocks full, blocks in all) over every grid: the visited fraction is the
    /// first over the last, the fraction that skips the mask's evaluation the second.
    #[getter]
    fn counts(&self) -> (usize, usize, usize) {
        let m = &self.inner;
        let on = m.blocks.iter().filter(|&&b| b).count();
        let full = m.full.iter().flatten().filter(|&&b| b).count();
        (on, full, m.blocks.len())
    }
}

/// The block mask of a user mask (FlexAttention's create_block_mask): `mask_mod` WGSL with its
/// captured tensors, over `batch x heads` grids (1: the mask does not depend on it) of
/// `seq_q x seq_kv`, in blocks of `block_q x block_kv`.
#[pyfunction]
fn create_block_mask(
    py: Python<'_>,
    mask_mod: String,
    mask_mod_tensors: Vec<(String, Vec<f32>)>,
    grid: (usize, usize, usize, usize),
    blocks: (usize, usize),
) -> PyResult<PyBlockMask> {
    let ctx = context(py)?;
    let mask = MaskMod::wgsl_with(&mask_mod, mask_mod_tensors.clone()).map_err(|e| to_py(py, e))?;
    let inner = py
        .detach(|| ctx.create_block_mask(&mask, grid, blocks))
        .map_err(|e| to_py(py, e))?;
    Ok(PyBlockMask {
        inner,
        mask_mod,
        mask_mod_tensors,
    })
}

fn dims4(py: Python<'_>, name: &str, t: &Tensor) -> PyResult<[usize; 4]> {
    <[usize; 4]>::try_from(t.shape()).map_err(|_| {
        invalid(
            py,
            format!(
                "{name} must have 4 dimensions [batch, seq, heads, head_dim], got shape {:?}",
                t.shape()
            ),
        )
    })
}

/// The config of a call: sizes from q and k (or the paged pools), the values' head dim from
/// v's last dimension (`head_dim_v` where it differs from q's, as flash-attn 3 reads it), the
/// options on top.
fn config(
    py: Python<'_>,
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    o: &Options,
) -> PyResult<AttentionConfig> {
    let (kd, vd) = (dims4(py, "k", k)?, dims4(py, "v", v)?);
    config_for(py, q, (kd, vd[3]), o)
}

/// [`config`] from k's shape and v's last dimension (an 8-bit cache's).
fn config_for(
    py: Python<'_>,
    q: &Tensor,
    ([kb, skv, hkv, _], dv): ([usize; 4], usize),
    o: &Options,
) -> PyResult<AttentionConfig> {
    let [b, sq, hq, d] = dims4(py, "q", q)?;
    let mut cfg = match (&o.cu_seqlens_q, &o.cu_seqlens_k, &o.block_table) {
        (Some(cq), Some(ck), None) => AttentionConfig::packed(cq.clone(), ck.clone(), hq, hkv, d),
        (None, None, Some((table, pages_per_seq))) => {
            let mut c = AttentionConfig::new(b, sq, pages_per_seq * skv, hq, hkv, d);
            c.paged = Some(PagedKv {
                page_size: skv,
                num_pages: kb,
                pages_per_seq: *pages_per_seq,
                block_table: table.clone(),
            });
            c
        }
        (None, None, None) => AttentionConfig::new(b, sq, skv, hq, hkv, d),
        _ => {
            return Err(invalid(
                py,
                "cu_seqlens_q and cu_seqlens_k go together, and not with a block table".into(),
            ))
        }
    };
    apply_options(py, &mut cfg, o)?;
    if dv != cfg.head_dim {
        cfg.head_dim_v = Some(dv);
    }
    Ok(cfg)
}

/// The options on top of a config of the call's sizes: masks, modifiers, scale, dropout.
fn apply_options(py: Python<'_>, cfg: &mut AttentionConfig, o: &Options) -> PyResult<()> {
    cfg.causal = o.causal;
    cfg.softmax_scale = o.softmax_scale;
    let side = |n: i64| (n >= 0).then_some(n as usize);
    cfg.window = Window::new(side(o.window_size.0), side(o.window_size.1));
    cfg.softcap = (o.softcap != 0.0).then_some(o.softcap);
    cfg.alibi_slopes = o.alibi_slopes.clone();
    if o.dropout_p != 0.0 {
        cfg.dropout = Some(Dropout::new(o.dropout_p, o.seed, 0));
    }
    cfg.kv_splits = (o.num_splits > 0).then_some(o.num_splits);
    cfg.leftpad_kv = o.leftpad_k.clone();
    if let Some(src) = &o.score_mod {
        let captured = o.score_mod_tensors.iter().cloned();
        let mut m = ScoreMod::wgsl_with(src, captured).map_err(|e| to_py(py, e))?;
        if let Some(name) = &o.score_mod_trainable {
            m = m.with_trainable(name).map_err(|e| to_py(py, e))?;
        }
        cfg.score_mod = Some(m);
    } else if let Some(name) = &o.score_mod_trainable {
        return Err(invalid(
            py,
            format!(
                "score_mod_trainable={name:?} names a tensor of a score_mod, but no score_mod \
                 was given"
            ),
        ));
    }
    if let Some(src) = &o.mask_mod {
        let captured = o.mask_mod_tensors.iter().cloned();
        cfg.mask_mod = Some(MaskMod::wgsl_with(src, captured).map_err(|e| to_py(py, e))?);
    }
    cfg.block_mask = o.block_mask.as_ref().map(|m| m.get().inner.clone());
    Ok(())
}

/// Forward: (out, lse).
#[pyfunction]
fn forward(
    py: Python<'_>,
    q: PyRef<'_, PyTensor>,
    k: PyRef<'_, PyTensor>,
    v: PyRef<'_, PyTensor>,
    options: Options,
) -> PyResult<(PyTensor, PyTensor)> {
    let ctx = context(py)?;
    let (q, k, v) = (&q.inner, &k.inner, &v.inner);
    let cfg = config(py, (q, k, v), &options)?;
    let f = py
        .detach(|| ctx.forward(&cfg, q, k, v))
        .map_err(|e| to_py(py, e))?;
    Ok((PyTensor { inner: f.out }, PyTensor { inner: f.lse }))
}

/// Backward from the forward's out and lse: (dq, dk, dv, d_table), d_table the trainable
/// captured tensor's gradient (f32) where the options name one, else None.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn backward(
    py: Python<'_>,
    d_out: PyRef<'_, PyTensor>,
    q: PyRef<'_, PyTensor>,
    k: PyRef<'_, PyTensor>,
    v: PyRef<'_, PyTensor>,
    out: PyRef<'_, PyTensor>,
    lse: PyRef<'_, PyTensor>,
    options: Options,
) -> PyResult<(PyTensor, PyTensor, PyTensor, Option<PyTensor>)> {
    let ctx = context(py)?;
    let (q, k, v) = (&q.inner, &k.inner, &v.inner);
    let (out, lse, d_out) = (&out.inner, &lse.inner, &d_out.inner);
    let cfg = config(py, (q, k, v), &options)?;
    let g = py
        .detach(|| ctx.backward(&cfg, q, k, v, out, lse, d_out))
        .map_err(|e| to_py(py, e))?;
    Ok((
        PyTensor { inner: g.dq },
        PyTensor { inner: g.dk },
        PyTensor { inner: g.dv },
        g.d_table.map(|t| PyTensor { inner: t }),
    ))
}

/// The rotary tables a KV-cache call was given: (cos, sin, interleaved).
type RotaryArg<'py> = Option<(PyRef<'py, PyTensor>, PyRef<'py, PyTensor>, bool)>;

fn rotary_of<'a>(rotary: &'a RotaryArg<'_>) -> Option<Rotary<'a, Tensor>> {
    rotary.as_ref().map(|(cos, sin, interleaved)| Rotary {
        cos: &cos.inner,
        sin: &sin.inner,
        interleaved: *interleaved,
    })
}

/// The new keys and values a KV-cache call appends: both or neither.
fn append_of<'a>(
    py: Python<'_>,
    k_new: &'a Option<PyRef<'_, PyTensor>>,
    v_new: &'a Option<PyRef<'_, PyTensor>>,
) -> PyResult<Option<(&'a Tensor, &'a Tensor)>> {
    match (k_new, v_new) {
        (Some(k), Some(v)) => Ok(Some((&k.inner, &v.inner))),
        (None, None) => Ok(None),
        _ => Err(invalid(
            py,
            "k and v are appended together: give both or neither".into(),
        )),
    }
}

/// Attention over a KV cache after appending (k_new, v_new) at each batch's length; the
/// caches are written in place: (out, lse). `rotary`: (cos, sin, interleaved) tables that
/// rotate q and the new keys first.
#[pyfunction]
#[pyo3(signature = (q, k_cache, v_cache, cache_seqlens, k_new, v_new, options, rotary=None))]
#[allow(clippy::too_many_arguments)]
fn forward_with_kvcache(
    py: Python<'_>,
    q: PyRef<'_, PyTensor>,
    mut k_cache: PyRefMut<'_, PyTensor>,
    mut v_cache: PyRefMut<'_, PyTensor>,
    cache_seqlens: Vec<usize>,
    k_new: Option<PyRef<'_, PyTensor>>,
    v_new: Option<PyRef<'_, PyTensor>>,
    options: Options,
    rotary: RotaryArg<'_>,
) -> PyResult<(PyTensor, PyTensor)> {
    let ctx = context(py)?;
    let q = &q.inner;
    let cfg = config(py, (q, &k_cache.inner, &v_cache.inner), &options)?;
    let rotary = rotary_of(&rotary);
    let append = append_of(py, &k_new, &v_new)?;
    let (kc, vc) = (&mut k_cache.inner, &mut v_cache.inner);
    let f = py
        .detach(|| match rotary {
            Some(r) => ctx.forward_with_kvcache_rotary(&cfg, q, kc, vc, &cache_seqlens, append, r),
            None => ctx.forward_with_kvcache(&cfg, q, kc, vc, &cache_seqlens, append),
        })
        .map_err(|e| to_py(py, e))?;
    Ok((PyTensor { inner: f.out }, PyTensor { inner: f.lse }))
}

/// A KV cache in GPU memory stored in 8 bits (q8_0 or e4m3), updated in place by the calls.
#[pyclass(name = "QuantizedCache", module = "flash_attn_wgpu._native")]
struct PyQuantizedCache {
    inner: QuantizedCache,
}

#[pymethods]
impl PyQuantizedCache {
    /// The shape of the values it holds.
    #[getter]
    fn shape(&self) -> Vec<usize> {
        self.inner.shape().to_vec()
    }

    /// Its format: "q8_0" or "e4m3".
    #[getter]
    fn format(&self) -> &'static str {
        self.inner.format().name()
    }

    /// The values it holds as float32, dequantized as the kernels read them.
    fn dequantize<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, numpy::PyArrayDyn<f32>>> {
        let ctx = context(py)?;
        let v = py
            .detach(|| ctx.dequantize_cache(&self.inner))
            .map_err(|e| to_py(py, e))?;
        v.to_pyarray(py).reshape(self.inner.shape().to_vec())
    }
}

/// An 8-bit cache holding `array` (float32, 4-d), quantized on the host.
#[pyfunction]
#[pyo3(signature = (array, format, head_scales=None))]
fn quantized_cache(
    py: Python<'_>,
    array: PyReadonlyArrayDyn<'_, f32>,
    format: &str,
    head_scales: Option<Vec<f32>>,
) -> PyResult<PyQuantizedCache> {
    let ctx = context(py)?;
    let f: CacheFormat = format.parse().map_err(|e: String| invalid(py, e))?;
    let shape = cache_shape(py, array.shape())?;
    let data = array.as_slice()?;
    let inner = py
        .detach(|| ctx.quantized_cache(f, data, shape, head_scales.as_deref()))
        .map_err(|e| to_py(py, e))?;
    Ok(PyQuantizedCache { inner })
}

/// Per-kv-head E4M3 scales for `array` (float32, 4-d): `CacheFormat::e4m3_head_scales`.
#[pyfunction]
fn e4m3_head_scales(py: Python<'_>, array: PyReadonlyArrayDyn<'_, f32>) -> PyResult<Vec<f32>> {
    let shape = cache_shape(py, array.shape())?;
    Ok(CacheFormat::e4m3_head_scales(array.as_slice()?, shape))
}

/// The shape of a cache's values: 4 dimensions.
fn cache_shape(py: Python<'_>, shape: &[usize]) -> PyResult<[usize; 4]> {
    <[usize; 4]>::try_from(shape).map_err(|_| {
        invalid(
            py,
            format!("a cache has 4 dimensions [batch, seq, heads, head_dim], got shape {shape:?}"),
        )
    })
}

/// [`forward_with_kvcache`] over 8-bit caches.
#[pyfunction]
#[pyo3(signature = (q, k_cache, v_cache, cache_seqlens, k_new, v_new, options, rotary=None))]
#[allow(clippy::too_many_arguments)]
fn forward_with_quantized_kvcache(
    py: Python<'_>,
    q: PyRef<'_, PyTensor>,
    mut k_cache: PyRefMut<'_, PyQuantizedCache>,
    mut v_cache: PyRefMut<'_, PyQuantizedCache>,
    cache_seqlens: Vec<usize>,
    k_new: Option<PyRef<'_, PyTensor>>,
    v_new: Option<PyRef<'_, PyTensor>>,
    options: Options,
    rotary: RotaryArg<'_>,
) -> PyResult<(PyTensor, PyTensor)> {
    let ctx = context(py)?;
    let q = &q.inner;
    let dv = v_cache.inner.shape()[3];
    let cfg = config_for(py, q, (k_cache.inner.shape(), dv), &options)?;
    let rotary = rotary_of(&rotary);
    let append = append_of(py, &k_new, &v_new)?;
    let caches = (&mut k_cache.inner, &mut v_cache.inner);
    let f = py
        .detach(|| match rotary {
            Some(r) => ctx.forward_with_quantized_kvcache_rotary(
                &cfg,
                q,
                caches,
                &cache_seqlens,
                append,
                r,
            ),
            None => ctx.forward_with_quantized_kvcache(&cfg, q, caches, &cache_seqlens, append),
        })
        .map_err(|e| to_py(py, e))?;
    Ok((PyTensor { inner: f.out }, PyTensor { inner: f.lse }))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyQuantizedCache>()?;
    m.add_function(wrap_pyfunction!(quantized_cache, m)?)?;
    m.add_function(wrap_pyfunction!(e4m3_head_scales, m)?)?;
    m.add_function(wrap_pyfunction!(forward_with_quantized_kvcache, m)?)?;
    m.add_class::<PyTensor>()?;
    m.add_class::<PyBlockMask>()?;
    m.add_function(wrap_pyfunction!(create_block_mask, m)?)?;
    m.add_function(wrap_pyfunction!(upload, m)?)?;
    m.add_function(wrap_pyfunction!(adapter, m)?)?;
    m.add_function(wrap_pyfunction!(forward, m)?)?;
    m.add_function(wrap_pyfunction!(backward, m)?)?;
    m.add_function(wrap_pyfunction!(forward_with_kvcache, m)?)?;
    m.add_function(wrap_pyfunction!(distributed::cp_forward, m)?)?;
    m.add_function(wrap_pyfunction!(distributed::cp_backward, m)?)?;
    m.add_function(wrap_pyfunction!(distributed::cp_refuse, m)?)?;
    Ok(())
}
