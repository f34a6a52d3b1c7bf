//! Context parallelism from Python: the library's ring and all-gather
//! (`flash_attn_wgpu::distributed`, written once in Rust) over an mpi4py communicator. The
//! transport is mpi4py's (`PyComm`: `Isend`/`Irecv` of bytes, tested until their deadline), so
//! the wheel links no MPI and runs with whatever MPI mpi4py found; the work is the library's.
//! Arrays travel as float32 (the Python side casts and rounds the results once).
//!
//! Every exchange of a call is the library's, under its deadline (no blocking mpi4py
//! collective): a forward first agrees on what only the Python side knows (the function, the
//! dtype, the schedule, each rank's rows, rank 0's dropout seed), then on the call itself (the
//! library's agreement). A rank that refuses its inputs, in Python (`cp_refuse`) or here, takes
//! part in the first agreement with its reason, so that the others fail at once with it.

use std::time::{Duration, Instant};

use flash_attn_wgpu::distributed::{
    agree, timeout, Comm, ContextParallel, Layout, Schedule, Terms,
};
use flash_attn_wgpu::{AttentionConfig, Error};
use numpy::{PyReadonlyArrayDyn, ToPyArray};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict};

use super::{apply_options, context, invalid, to_py, Options};

/// Our messages' tag, apart from the program's own traffic on the communicator.
const TAG: i32 = 0x5a11;

/// A rank of an mpi4py communicator.
struct PyComm {
    comm: Py<PyAny>,
    rank: usize,
    size: usize,
    timeout: Duration,
}

impl PyComm {
    fn new(comm: &Bound<'_, PyAny>) -> PyResult<PyComm> {
        Ok(PyComm {
            comm: comm.clone().unbind(),
            rank: comm.call_method0("Get_rank")?.extract()?,
            size: comm.call_method0("Get_size")?.extract()?,
            timeout: timeout(),
        })
    }

    fn failed(&self, e: PyErr) -> Error {
        Error::Distributed {
            rank: self.rank,
            message: format!("mpi4py: {e}"),
        }
    }
}

impl Comm for PyComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn shift(
        &self,
        send: Vec<u8>,
        recv_len: usize,
        during: &mut dyn FnMut() -> flash_attn_wgpu::Result<()>,
    ) -> flash_attn_wgpu::Result<Vec<u8>> {
        let (next, prev) = (
            (self.rank + 1) % self.size,
            (self.rank + self.size - 1) % self.size,
        );
        Python::attach(|py| {
            let start =
                || -> PyResult<(Bound<'_, PyByteArray>, Bound<'_, PyAny>, Bound<'_, PyAny>)> {
                    let byte = py.import("mpi4py.MPI")?.getattr("BYTE")?;
                    let comm = self.comm.bind(py);
                    let recv = PyByteArray::new(py, &vec![0u8; recv_len]);
                    let at = |peer: usize, key: &str| -> PyResult<Bound<'_, PyDict>> {
                        let kw = PyDict::new(py);
                        kw.set_item(key, peer)?;
                        kw.set_item("tag", TAG)?;
                        Ok(kw)
                    };
                    let r = comm.call_method(
                        "Irecv",
                        ((recv.clone(), byte.clone()),),
                        Some(&at(prev, "source")?),
                    )?;
                    let s = comm
                        .call_method(
                            "Isend",
                            ((PyBytes::new(py, &send), byte),),
                            Some(&at(next, "dest")?),
                        )
                        .inspect_err(|_| {
                            // the receive is posted: its buffer stays MPI's
                            std::mem::forget((recv.clone(), r.clone()));
                        })?;
                    Ok((recv, r, s))
                };
            let (recv, r, s) = start().map_err(|e| self.failed(e))?;
            let done = during();
            let deadline = Instant::now() + self.timeout;
            let test =
                |req: &Bound<'_, PyAny>| -> PyResult<bool> { req.call_method0("Test")?.extract() };
            let (mut sent, mut received) = (false, false);
            while !(sent && received) {
                sent = sent || test(&s).map_err(|e| self.failed(e))?;
                received = received || test(&r).map_err(|e| self.failed(e))?;
                if !(sent && received) {
                    if Instant::now() >= deadline {
                        // mpi4py's requests hold their buffers: kept alive for MPI
                        std::mem::forget((recv, r, s));
                        let from = if received { next } else { prev };
                        return Err(Error::Distributed {
                            rank: self.rank,
                            message: format!(
                                "no message from rank {from} within {:.0} s \
                                 (FLASH_ATTN_MPI_TIMEOUT_S): that rank died, left the call, \
                                 or is stuck; every rank must make the same calls",
                                self.timeout.as_secs_f64()
                            ),
                        });
                    }
                    py.detach(|| std::thread::sleep(Duration::from_micros(50)));
                }
            }
            done?;
            Ok(recv.to_vec())
        })
    }
}

/// The whole call's config: `dims` (batch, seq, heads_q, heads_kv, head_dim, head_dim_v) and
/// the options.
fn whole(
    py: Python<'_>,
    dims: (usize, usize, usize, usize, usize, usize),
    o: &Options,
) -> PyResult<AttentionConfig> {
    let (b, n, hq, hkv, d, dv) = dims;
    let mut cfg = AttentionConfig::new(b, n, n, hq, hkv, d);
    apply_options(py, &mut cfg, o)?;
    if dv != d {
        cfg.head_dim_v = Some(dv);
    }
    Ok(cfg)
}

fn parallel<'a>(
    py: Python<'_>,
    ctx: &'a flash_attn_wgpu::Context,
    comm: &'a PyComm,
    schedule: &str,
    layout: &str,
) -> PyResult<ContextParallel<'a>> {
    let schedule = match schedule {
        "ring" => Schedule::Ring,
        "all_gather" => Schedule::AllGather,
        "auto" => Schedule::Auto,
        other => {
            return Err(invalid(
                py,
                format!("schedule must be 'ring', 'all_gather' or 'auto', got {other:?}"),
            ))
        }
    };
    let layout = match layout {
        "zigzag" => Layout::Zigzag,
        "contiguous" => Layout::Contiguous,
        other => {
            return Err(invalid(
                py,
                format!("layout must be 'zigzag' or 'contiguous', got {other:?}"),
            ))
        }
    };
    Ok(ContextParallel::new(ctx, comm)
        .with_schedule(schedule)
        .with_layout(layout))
}

fn flat(a: &PyReadonlyArrayDyn<'_, f32>) -> Vec<f32> {
    a.as_array().iter().copied().collect()
}

/// The message of a Python error, as a refusal's reason.
fn reason(py: Python<'_>, e: &PyErr) -> String {
    e.value(py).to_string()
}

/// Takes part in the first agreement of the call the other ranks make, as a rank that refused
/// its inputs for `reason` (the Python side's own checks): they fail at once, naming this rank
/// and the reason. The caller then raises its own error.
#[pyfunction]
pub(crate) fn cp_refuse(comm: Bound<'_, PyAny>, reason: String) -> PyResult<()> {
    let comm = PyComm::new(&comm)?;
    // the verdict names this rank's refusal: the caller's own error says it better
    let _ = agree(&comm, &Terms::refusal(reason));
    Ok(())
}

/// This rank's share of the whole call's forward over the ranks of `comm`: (out, lse) flat
/// float32, and the whole sequence's length and the dropout seed (for the backward). `dims`
/// are this rank's (batch, local rows, heads_q, heads_kv, head_dim, head_dim_v); the whole
/// sequence is every rank's rows together, and the dropout seed rank 0's (options.seed), both
/// learned in the first agreement with `function` and `dtype`.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub(crate) fn cp_forward<'py>(
    py: Python<'py>,
    comm: Bound<'py, PyAny>,
    q: PyReadonlyArrayDyn<'py, f32>,
    k: PyReadonlyArrayDyn<'py, f32>,
    v: PyReadonlyArrayDyn<'py, f32>,
    dims: (usize, usize, usize, usize, usize, usize),
    function: &str,
    dtype: &str,
    options: Options,
    schedule: &str,
    layout: &str,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>, usize, u64)> {
    let comm = PyComm::new(&comm)?;
    let prepared = context(py).and_then(|ctx| {
        let cfg = whole(py, dims, &options)?;
        Ok((cfg, parallel(py, ctx, &comm, schedule, layout)?))
    });
    let terms = Terms {
        call: [
            ("function", function),
            ("dtype", dtype),
            ("schedule", schedule),
        ]
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .to_vec(),
        own: vec![dims.1 as u64, options.seed],
        refused: prepared.as_ref().err().map(|e| reason(py, e)),
    };
    let agreed = agree(&comm, &terms);
    let (mut cfg, cp) = prepared?;
    let all = agreed.map_err(|e| to_py(py, e))?;
    // each rank's rows, then rank 0's seed: the ranks agreed on the function
    let n: usize = all
        .iter()
        .map(|t| t.own.first().copied().unwrap_or(0) as usize)
        .sum();
    (cfg.seq_q, cfg.seq_kv) = (n, n);
    let seed = all[0].own.get(1).copied().unwrap_or(options.seed);
    if let Some(d) = cfg.dropout.as_mut() {
        d.seed = seed;
    }
    let f = cp
        .forward(&cfg, &flat(&q), &flat(&k), &flat(&v))
        .map_err(|e| to_py(py, e))?;
    Ok((
        f.out.to_pyarray(py).into_any(),
        f.lse.to_pyarray(py).into_any(),
        n,
        seed,
    ))
}

/// A backward's arrays, this rank's rows: q, k, v, out, lse, d_out.
type BackwardArrays<'py> = (
    PyReadonlyArrayDyn<'py, f32>,
    PyReadonlyArrayDyn<'py, f32>,
    PyReadonlyArrayDyn<'py, f32>,
    PyReadonlyArrayDyn<'py, f32>,
    PyReadonlyArrayDyn<'py, f32>,
    PyReadonlyArrayDyn<'py, f32>,
);

/// This rank's share of the whole call's backward: (dq, dk, dv), flat float32. `dims` are
/// the whole call's, as the forward agreed them.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub(crate) fn cp_backward<'py>(
    py: Python<'py>,
    comm: Bound<'py, PyAny>,
    tensors: BackwardArrays<'py>,
    dims: (usize, usize, usize, usize, usize, usize),
    options: Options,
    schedule: &str,
    layout: &str,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    let comm = PyComm::new(&comm)?;
    let prepared = context(py).and_then(|ctx| {
        let cfg = whole(py, dims, &options)?;
        Ok((cfg, parallel(py, ctx, &comm, schedule, layout)?))
    });
    let (cfg, cp) = match prepared {
        Ok(p) => p,
        Err(e) => {
            // the library's agreement is this call's first exchange: refused in it
            let _ = agree(&comm, &Terms::refusal(reason(py, &e)));
            return Err(e);
        }
    };
    let (q, k, v, out, lse, d_out) = tensors;
    let g = cp
        .backward(
            &cfg,
            &flat(&q),
            &flat(&k),
            &flat(&v),
            &flat(&out),
            &flat(&lse),
            &flat(&d_out),
        )
        .map_err(|e| to_py(py, e))?;
    Ok((
        g.dq.to_pyarray(py).into_any(),
        g.dk.to_pyarray(py).into_any(),
        g.dv.to_pyarray(py).into_any(),
    ))
}
