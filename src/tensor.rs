//! Device-resident tensors: a storage buffer, its shape and its element type.

use crate::checks::{check_meta, shape_elements};
use crate::device::{Context, TrackedBuffer};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result, TensorRole};

/// A tensor in device memory, of one element type: row-major, or a strided view of a
/// caller's buffer ([`Context::tensor_from_buffer`]).
///
/// Half-precision tensors hold two elements per 4-byte word (or `array<f16>` where the
/// adapter has `SHADER_F16`: the same bytes); a buffer is padded to a whole word.
#[derive(Debug)]
pub struct Tensor {
    buf: Storage,
    /// Byte offset of element 0 in the buffer (a wrapped buffer's view; 0 otherwise).
    offset: u64,
    /// Where the tensor is bound from: `offset`, or below it at the device's offset alignment
    /// for a view whose offset is not aligned (the kernels then start at an element shift).
    bind_offset: u64,
    shape: Vec<usize>,
    /// Element strides of each dimension: row-major unless a wrapped view says otherwise.
    strides: Vec<usize>,
    dtype: DType,
    role: Option<TensorRole>,
}

/// A tensor's buffer: made (and counted) by the context, or a caller's, wrapped without a copy
/// ([`Context::tensor_from_buffer`]), tagged with the context it was wrapped for.
#[derive(Debug)]
enum Storage {
    Owned(TrackedBuffer),
    Wrapped {
        buffer: wgpu::Buffer,
        owner: std::sync::Arc<crate::device::memory::MemTracker>,
    },
}

impl Tensor {
    /// The dimensions, outermost first (row-major).
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Which result this tensor is (out, lse, dq, ...), for tensors a call created.
    pub fn role(&self) -> Option<TensorRole> {
        self.role
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether the tensor has no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element strides of each dimension (row-major unless the tensor wraps a strided view).
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// True when the elements lie row-major from [`offset`](Tensor::offset).
    pub fn is_row_major(&self) -> bool {
        self.strides == row_major(&self.shape)
    }

    /// Bytes of device memory the tensor takes: its buffer's, or a wrapped view's (the bytes
    /// its binding covers, padded to a whole 4-byte word).
    pub fn size_bytes(&self) -> u64 {
        match &self.buf {
            Storage::Owned(b) => b.buffer.size(),
            Storage::Wrapped { .. } => self.view_bytes(),
        }
    }

    /// Bytes of the binding from `bind_offset` to past the view's last element, padded to a
    /// whole word (and never past the buffer).
    fn view_bytes(&self) -> u64 {
        // checked when the view was wrapped (it lies within the buffer)
        let extent = view_extent(&self.shape, &self.strides).unwrap_or(u64::MAX);
        let bytes = (self.offset - self.bind_offset)
            + extent.saturating_mul(self.dtype.size_bytes() as u64);
        bytes
            .next_multiple_of(4)
            .min(self.buffer().size() - self.bind_offset)
    }

    /// True when the kernels must read this tensor through a view (`Params::views`): strides
    /// that are not row-major, or an offset below which the binding starts.
    pub(crate) fn needs_view(&self) -> bool {
        self.offset != self.bind_offset || !self.is_row_major()
    }

    /// The view's words for `Params::views`: its first element in the binding and the
    /// strides of batch, row and head (a three-dimensional `[rows, heads, head_dim]` tensor,
    /// varlen's, has one batch). `None` when a value does not fit 32 bits.
    pub(crate) fn view_words(&self) -> Option<[u32; 4]> {
        let shift = (self.offset - self.bind_offset) / self.dtype.size_bytes() as u64;
        let n = self.strides.len();
        let (b, i, h) = match n {
            4 => (self.strides[0], self.strides[1], self.strides[2]),
            3 => (0, self.strides[0], self.strides[1]),
            _ => return None,
        };
        let w = |x: u64| u32::try_from(x).ok();
        Some([w(shift)?, w(b as u64)?, w(i as u64)?, w(h as u64)?])
    }

    /// The underlying buffer, for chaining with your own wgpu work; the tensor starts at
    /// [`offset`](Tensor::offset) in it.
    pub fn buffer(&self) -> &wgpu::Buffer {
        match &self.buf {
            Storage::Owned(b) => &b.buffer,
            Storage::Wrapped { buffer, .. } => buffer,
        }
    }

    /// Byte offset of element 0 in [`buffer`](Tensor::buffer): 0 unless the tensor wraps a
    /// caller's buffer at an offset.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The byte window of the buffer the tensor is bound through, where it is not the whole
    /// buffer (a wrapped view).
    pub(crate) fn view(&self) -> Option<crate::plan::Window> {
        match &self.buf {
            Storage::Owned(_) => None,
            Storage::Wrapped { .. } => Some(crate::plan::Window {
                offset: self.bind_offset,
                size: self.size_bytes(),
            }),
        }
    }

    pub(crate) fn with_role(mut self, role: TensorRole) -> Self {
        self.role = Some(role);
        self
    }

    /// How errors name this tensor: its role, or "tensor" and its shape.
    pub(crate) fn describe(&self) -> String {
        match self.role {
            Some(r) => r.to_string(),
            None => format!("tensor of shape {:?}", self.shape),
        }
    }
}

/// Elements from a view's first to one past the last an element of it can reach; `None` past
/// u64.
fn view_extent(shape: &[usize], strides: &[usize]) -> Option<u64> {
    shape.iter().zip(strides).try_fold(1u64, |e, (&n, &st)| {
        (n as u64 - 1)
            .checked_mul(st as u64)
            .and_then(|x| e.checked_add(x))
    })
}

/// The row-major strides of `shape`, in elements.
pub(crate) fn row_major(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    strides
}

/// A device tensor belongs to `ctx`, has the shape the config implies and the call's dtype.
pub(crate) fn check_tensor(
    ctx: &Context,
    role: TensorRole,
    t: &Tensor,
    expected: &[usize],
    dtype: DType,
) -> Result<()> {
    ctx.check_owned(t, || role.to_string())?;
    check_meta(role, t.shape(), t.dtype(), expected, dtype)
}

impl Context {
    /// A typed error unless `t` was created by this context (its buffer belongs to this
    /// context's device; another context's buffer would read unrelated memory or fault).
    pub(crate) fn check_owned(&self, t: &Tensor, name: impl FnOnce() -> String) -> Result<()> {
        let mine = match &t.buf {
            Storage::Owned(b) => b.belongs_to(&self.mem),
            Storage::Wrapped { owner, .. } => std::sync::Arc::ptr_eq(owner, &self.mem),
        };
        if mine {
            Ok(())
        } else {
            Err(Error::ForeignTensor { tensor: name() })
        }
    }

    /// The caller's tensors as a plan's outputs (`Context::forward_into` and kin): one per
    /// output, each made by this context (not wrapped: outputs bind whole buffers), of the
    /// output's shape and dtype, and none of them also an input or another output (a buffer
    /// bound twice, once writable, fails validation). Returns handles on the same buffers.
    pub(crate) fn given_outputs(
        &self,
        plan: &crate::plan::Plan,
        inputs: &[&Tensor],
        given: &[&Tensor],
    ) -> Result<Vec<Tensor>> {
        if given.len() != plan.outputs.len() {
            return Err(Error::Device(format!(
                "internal: plan makes {} outputs, {} given",
                plan.outputs.len(),
                given.len()
            )));
        }
        let mut handles = Vec::with_capacity(given.len());
        for (n, (o, t)) in plan.outputs.iter().zip(given).enumerate() {
            check_tensor(self, o.role, t, &o.shape, o.dtype)?;
            let Storage::Owned(b) = &t.buf else {
                return Err(Error::Buffer {
                    what: format!("{} given as an output", o.role),
                    expected: "a tensor this context made (a call's result, upload or zeros_of)"
                        .into(),
                    got: "a wrapped buffer (tensor_from_buffer): pass a tensor of this context \
                          and copy from it"
                        .into(),
                });
            };
            let clash = inputs
                .iter()
                .map(|i| i.buffer())
                .chain(given[..n].iter().map(|g| g.buffer()));
            if clash.into_iter().any(|other| *other == b.buffer) {
                return Err(Error::InvalidConfig(format!(
                    "the tensor given as {} is also an input or another output of the call: \
                     each output needs a tensor of its own",
                    o.role
                )));
            }
            handles.push(Tensor {
                buf: Storage::Wrapped {
                    buffer: b.buffer.clone(),
                    owner: self.mem.clone(),
                },
                offset: 0,
                bind_offset: 0,
                shape: t.shape.clone(),
                strides: t.strides.clone(),
                dtype: t.dtype,
                role: Some(o.role),
            });
        }
        Ok(handles)
    }

    /// Writes host data into an existing tensor of this context, in place (a queue write: no
    /// allocation on the device, no wait; it runs before any later call's work). `T` must be
    /// the tensor's dtype and `data` hold its every element; the tensor row-major (not a
    /// strided view). A decode loop writes each step's query this way instead of uploading a
    /// new tensor.
    pub fn write<T: Element>(&self, t: &Tensor, data: &[T]) -> Result<()> {
        self.check_owned(t, || t.describe())?;
        if t.dtype != T::DTYPE {
            return Err(Error::DType {
                tensor: t.describe(),
                expected: t.dtype,
                got: T::DTYPE,
            });
        }
        if data.len() != t.len() {
            return Err(Error::invalid(format!(
                "write: {} values given for {} of shape {:?}, which holds {}",
                data.len(),
                t.describe(),
                t.shape,
                t.len()
            )));
        }
        if t.needs_view() {
            return Err(strided_unsupported("write", t));
        }
        let bytes: &[u8] = bytemuck::cast_slice(data);
        // queue writes go in whole words: an odd count of half elements ends mid-word. The
        // rest of that word is padding in a tensor's own buffer (written as zero); in a
        // wrapped buffer it may be the caller's, so it is read back and kept (a wait).
        let whole = bytes.len() / 4 * 4;
        if whole > 0 {
            self.queue
                .write_buffer(t.buffer(), t.offset, &bytes[..whole]);
        }
        if whole < bytes.len() {
            let at = t.offset + whole as u64;
            let mut word = match t.buf {
                Storage::Owned(_) => vec![0u8; 4],
                Storage::Wrapped { .. } => self.read_buffer_at::<u8>(t.buffer(), at, 4)?,
            };
            word[..bytes.len() - whole].copy_from_slice(&bytes[whole..]);
            self.queue.write_buffer(t.buffer(), at, &word);
        }
        Ok(())
    }

    /// Copies host data to a new device tensor of the given shape. `T` is f32, `half::f16`
    /// or `half::bf16`, and the tensor takes that dtype.
    pub fn upload<T: Element>(&self, data: &[T], shape: &[usize]) -> Result<Tensor> {
        let n = shape_elements(shape)?;
        if data.len() != n {
            return Err(Error::invalid(format!(
                "upload: {} values given for shape {shape:?}, which holds {n}",
                data.len()
            )));
        }
        let buf = self.upload_bytes(bytemuck::cast_slice(data), "tensor")?;
        Ok(Tensor {
            buf: Storage::Owned(buf),
            offset: 0,
            bind_offset: 0,
            shape: shape.to_vec(),
            strides: row_major(shape),
            dtype: T::DTYPE,
            role: None,
        })
    }

    /// A new zero-filled f32 device tensor.
    pub fn zeros(&self, shape: &[usize]) -> Result<Tensor> {
        self.zeros_of(shape, DType::F32)
    }

    /// A new zero-filled device tensor of `dtype`.
    pub fn zeros_of(&self, shape: &[usize], dtype: DType) -> Result<Tensor> {
        let n = shape_elements(shape)?;
        let bytes = dtype
            .buffer_bytes(n as u64)
            .ok_or_else(|| Error::invalid(format!("shape {shape:?} of {dtype} is too large")))?;
        let buf = self.create_storage(bytes, "tensor")?;
        Ok(Tensor {
            buf: Storage::Owned(buf),
            offset: 0,
            bind_offset: 0,
            shape: shape.to_vec(),
            strides: row_major(shape),
            dtype,
            role: None,
        })
    }

    /// A new tensor holding `t` (f32) rounded to `dtype` on the device, to nearest even.
    pub fn cast(&self, t: &Tensor, dtype: DType) -> Result<Tensor> {
        self.check_owned(t, || t.describe())?;
        if t.dtype != DType::F32 {
            return Err(Error::DType {
                tensor: t.describe(),
                expected: DType::F32,
                got: t.dtype,
            });
        }
        if t.len() > u32::MAX as usize {
            return Err(Error::invalid(format!(
                "cast: {} elements, at most {} per call",
                t.len(),
                u32::MAX
            )));
        }
        if t.needs_view() {
            return Err(strided_unsupported("cast", t));
        }
        let plan = crate::plan::cast(&t.shape, dtype, &self.plan_env());
        let out = self.execute(&plan, &[t])?.pop();
        out.map(|o| Tensor { role: None, ..o })
            .ok_or_else(|| Error::Device("internal: cast plan without output".into()))
    }

    /// Copies a device tensor back to the host as `T`, which must be the tensor's dtype;
    /// row-major (a strided view's elements are gathered in its shape's row-major order).
    /// Waits for the GPU: in a browser, which cannot wait, it is `Unsupported`; use
    /// [`download_async`](Context::download_async) there.
    pub fn download<T: Element>(&self, t: &Tensor) -> Result<Vec<T>> {
        self.blocking("download", self.download_async(t))?
    }

    /// [`download`](Context::download) as a future, for the web: in a browser it waits for
    /// the mapping on the event loop and never blocks the thread; on native it waits for the
    /// device when polled.
    ///
    /// ```no_run
    /// # async fn run() -> flash_attn_wgpu::Result<()> {
    /// use flash_attn_wgpu::{AttentionConfig, Context};
    /// let ctx = Context::new_async().await?;
    /// let cfg = AttentionConfig::new(1, 16, 16, 2, 2, 8);
    /// let q = ctx.upload(&vec![0.5f32; 16 * 2 * 8], &cfg.q_shape())?;
    /// let f = ctx.forward(&cfg, &q, &q, &q)?; // queued, returns at once
    /// let out: Vec<f32> = ctx.download_async(&f.out).await?;
    /// # Ok(()) }
    /// ```
    pub async fn download_async<T: Element>(&self, t: &Tensor) -> Result<Vec<T>> {
        self.check_owned(t, || t.describe())?;
        if t.dtype != T::DTYPE {
            // the tensor has its dtype; the caller asked for T's
            return Err(Error::DType {
                tensor: t.describe(),
                expected: T::DTYPE,
                got: t.dtype,
            });
        }
        if !t.needs_view() {
            return self
                .read_buffer_at_async::<T>(t.buffer(), t.offset, t.len())
                .await;
        }
        // the bound bytes, then the view's elements picked out of them
        let esz = std::mem::size_of::<T>() as u64;
        // whole words, the last one too where the buffer ends mid-word
        let words = self
            .read_buffer_at_async::<u32>(
                t.buffer(),
                t.bind_offset,
                t.view_bytes().div_ceil(4) as usize,
            )
            .await?;
        let bytes: &[u8] = bytemuck::cast_slice(&words);
        let first = (t.offset - t.bind_offset) as usize;
        let mut out = Vec::with_capacity(t.len());
        let mut idx = vec![0usize; t.shape.len()];
        for _ in 0..t.len() {
            let e: usize = idx.iter().zip(&t.strides).map(|(i, s)| i * s).sum();
            let at = first + e * esz as usize;
            out.push(bytemuck::pod_read_unaligned(&bytes[at..at + esz as usize]));
            for d in (0..idx.len()).rev() {
                idx[d] += 1;
                if idx[d] < t.shape[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        Ok(out)
    }

    /// Wraps a view of a buffer you made on this context's device as a tensor of `shape` and
    /// `dtype`, with no copy: the calls read (and, row-major, write) it in place. Element
    /// `(i0, i1, ..)` lies at byte `offset + (i0 * strides[0] + i1 * strides[1] + ..) * size`.
    /// `strides` (in elements; `None`: row-major) may describe any layout whose last dimension
    /// (head_dim) is contiguous: a `[batch, heads, seq, head_dim]` (BHSD) buffer seen as
    /// `[batch, seq, heads, head_dim]`, or q, k and v inside one packed QKV projection.
    ///
    /// The buffer needs `STORAGE` usage (and `COPY_SRC` to be downloaded); `offset` must be a
    /// multiple of the element size, and of the device's `min_storage_buffer_offset_alignment`
    /// for a row-major view that a call writes (a KV-cache append) or casts; every element the
    /// view reaches must lie within the buffer. Views that are strided or start at an
    /// unaligned offset are read by the attention kernels (forward, backward, decode) through
    /// their strides; merges, casts, KV-cache appends, paged pools and calls larger than one
    /// binding take row-major tensors (`Unsupported` otherwise). Each is a typed error naming
    /// what was expected and given.
    ///
    /// ```no_run
    /// use flash_attn_wgpu::{wgpu, AttentionConfig, Context, DType};
    /// let ctx = Context::new()?;
    /// let cfg = AttentionConfig::new(1, 64, 64, 4, 4, 32);
    /// // the caller's packed projection: rows of [q | k | v], each heads x head_dim wide
    /// let width = 3 * 4 * 32;
    /// let qkv = ctx.device().create_buffer(&wgpu::BufferDescriptor {
    ///     label: Some("qkv"),
    ///     size: (64 * width * 4) as u64,
    ///     usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
    ///     mapped_at_creation: false,
    /// });
    /// let strides = [64 * width, width, 32, 1]; // [batch, seq, heads, head_dim]
    /// let view = |at: usize| {
    ///     ctx.tensor_from_buffer(&qkv, (at * 4) as u64, &cfg.q_shape(), Some(&strides), DType::F32)
    /// };
    /// let (q, k, v) = (view(0)?, view(4 * 32)?, view(2 * 4 * 32)?);
    /// let f = ctx.forward(&cfg, &q, &k, &v)?; // read in place, no copy
    /// # Ok::<(), flash_attn_wgpu::Error>(())
    /// ```
    pub fn tensor_from_buffer(
        &self,
        buffer: &wgpu::Buffer,
        offset: u64,
        shape: &[usize],
        strides: Option<&[usize]>,
        dtype: DType,
    ) -> Result<Tensor> {
        shape_elements(shape)?;
        let strides = match strides {
            None => row_major(shape),
            Some(s) if s.len() != shape.len() => {
                return Err(Error::invalid(format!(
                    "tensor_from_buffer: {} strides given for a shape of {} dimensions {shape:?}",
                    s.len(),
                    shape.len()
                )));
            }
            Some(s) => s.to_vec(),
        };
        if strides.last() != Some(&1) && shape.last() != Some(&1) {
            return Err(Error::Unsupported {
                feature: format!("tensor views whose last dimension is not contiguous (strides {strides:?} for shape {shape:?})"),
                backend: crate::Backend::Wgpu,
                reason: "the kernels read head_dim contiguously: the last stride must be 1".into(),
            });
        }
        if !buffer.usage().contains(wgpu::BufferUsages::STORAGE) {
            return Err(Error::Buffer {
                what: "tensor_from_buffer: the buffer's usage".into(),
                expected: "STORAGE among its usages (the kernels bind it as storage)".into(),
                got: format!("{:?}", buffer.usage()),
            });
        }
        let esz = dtype.size_bytes() as u64;
        if !offset.is_multiple_of(esz) {
            return Err(Error::Buffer {
                what: "tensor_from_buffer: the offset".into(),
                expected: format!("a multiple of the {dtype} element size ({esz} bytes)"),
                got: offset.to_string(),
            });
        }
        let align = (self.limits.min_storage_buffer_offset_alignment as u64).max(4);
        let end = view_extent(shape, &strides)
            .and_then(|e| e.checked_mul(esz))
            .and_then(|b| b.checked_add(offset));
        match end {
            Some(end) if end <= buffer.size() => {}
            _ => {
                return Err(Error::Buffer {
                    what: format!(
                        "tensor_from_buffer: shape {shape:?} with strides {strides:?} of {dtype} \
                         from offset {offset}"
                    ),
                    expected: format!("to end within the buffer's {} bytes", buffer.size()),
                    got: match end {
                        Some(end) => format!("an end at byte {end}, past the buffer"),
                        None => "an end past 2^64 bytes, past the buffer".into(),
                    },
                });
            }
        }
        Ok(Tensor {
            buf: Storage::Wrapped {
                buffer: buffer.clone(),
                owner: self.mem.clone(),
            },
            offset,
            bind_offset: offset - offset % align,
            shape: shape.to_vec(),
            strides,
            dtype,
            role: None,
        })
    }
}

/// The typed error of a call that takes row-major tensors, given a strided (or unaligned)
/// view.
pub(crate) fn strided_unsupported(call: &str, t: &Tensor) -> Error {
    Error::Unsupported {
        feature: format!(
            "{call} of a strided or unaligned tensor view ({}: strides {:?}, offset {})",
            t.describe(),
            t.strides,
            t.offset
        ),
        backend: crate::Backend::Wgpu,
        reason: "it takes row-major tensors at an aligned offset; the attention calls read views"
            .into(),
    }
}
