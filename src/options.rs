//! Options of an attention call.

use crate::alibi::AlibiSlopes;
use crate::bias::Bias;
use crate::plan::{ArchClass, Kernel};

/// Causal masking.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Causal {
    /// Every query sees every key.
    #[default]
    None,
    /// Query `i` sees keys `j <= i` (the diagonal starts at the top-left corner).
    TopLeft,
    /// Query `i` sees keys `j <= i + (seq_k - seq_q)`: the last query sees every key, as in
    /// decoding with a KV cache. Needs `seq_k >= seq_q` (else [`crate::Error::NoVisibleKeys`]).
    BottomRight,
}

/// Which implementation runs the attention.
///
/// ```
/// use flashcore::{plan::Kernel, Backend};
/// assert_eq!(Backend::from(Kernel::Wmma), Backend::Kernel(Kernel::Wmma));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Backend {
    /// The best available for the operands' location: on a GPU the kernel
    /// [`crate::plan::auto_kernel`] names (measured), the CPU reference for host tensors.
    #[default]
    Auto,
    /// The float64-accumulating CPU reference (host tensors).
    Cpu,
    /// One GPU kernel family (device tensors), with its own tile table
    /// ([`crate::plan::tile_table`]). A family that cannot run the call on this device or build
    /// gives [`crate::Error::BackendUnavailable`].
    Kernel(Kernel),
}

/// The backend that actually ran, reported by every call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// The CPU reference.
    Cpu,
    /// A GPU kernel family.
    Kernel(Kernel),
}

impl BackendKind {
    /// A short stable name, e.g. for bench tables.
    pub const fn name(self) -> &'static str {
        match self {
            BackendKind::Cpu => "cpu",
            BackendKind::Kernel(kernel) => kernel.name(),
        }
    }

    /// The GPU kernel family, `None` for the CPU reference.
    pub const fn kernel(self) -> Option<Kernel> {
        match self {
            BackendKind::Cpu => None,
            BackendKind::Kernel(kernel) => Some(kernel),
        }
    }
}

impl From<Kernel> for Backend {
    /// The backend that forces `kernel`.
    fn from(kernel: Kernel) -> Self {
        Backend::Kernel(kernel)
    }
}

impl From<Kernel> for BackendKind {
    fn from(kernel: Kernel) -> Self {
        BackendKind::Kernel(kernel)
    }
}

/// Options of [`crate::attention`] and [`crate::attention_into`]. Each setter returns a new
/// value and leaves `self` as it was (cheap: ALiBi slopes and a bias are shared, not copied), so
/// one set of options can seed several calls.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AttentionOptions {
    /// Softmax scale, positive and finite; `None` means `1 / sqrt(head_dim)`.
    pub scale: Option<f32>,
    /// Logit softcapping (Gemma 2, Grok): `scores = softcap * tanh(scale * q.k / softcap)`
    /// before the softmax; positive and finite ([`crate::Error::InvalidSoftcap`]). The CPU
    /// reference, the WMMA kernel and the Hopper kernel (`Kernel::CutlassSm90`, where `Backend::Auto` runs it for the call without the softcap;
    /// its tanh is `tanh.approx.f32`, absolute error below 1e-5) apply it; forcing another
    /// kernel is [`crate::Error::BackendUnavailable`].
    pub softcap: Option<f32>,
    /// Causal masking.
    pub causal: Causal,
    /// Sliding-window (local) attention: keys to the left and to the right of each query's
    /// diagonal that it may see (`None`: unbounded). See [`AttentionOptions::window`].
    pub window: (Option<usize>, Option<usize>),
    /// ALiBi: a bias of `-slope * |i + offset - j|` per query head. See
    /// [`AttentionOptions::alibi`].
    pub alibi: Option<AlibiSlopes>,
    /// An additive bias or mask on the scores. See [`AttentionOptions::bias`].
    pub bias: Option<Bias>,
    /// Which backend to run.
    pub backend: Backend,
    /// Also return the per-row logsumexp (natural log, f32, `[batch, heads, seq_q]`).
    pub return_lse: bool,
    /// Use this class's row of the backend's tile table instead of the device's own (e.g. to run the
    /// sm_89 tiles on an H200). The row must fit the device's shared memory. The GPU backward
    /// pass takes this class's choice of its key-block kernel (an L4's narrow one on an H200).
    pub force_arch_class: Option<ArchClass>,
}

impl AttentionOptions {
    /// Sets the softmax scale.
    pub fn scale(&self, scale: f32) -> Self {
        Self {
            scale: Some(scale),
            ..self.clone()
        }
    }

    /// Sets the logit softcap.
    pub fn softcap(&self, cap: f32) -> Self {
        Self {
            softcap: Some(cap),
            ..self.clone()
        }
    }

    /// Sets a sliding window (FlashAttention's definition): query `i` sees key `j` only when
    ///
    /// ```text
    /// i + offset - left <= j <= i + offset + right
    /// ```
    ///
    /// with `offset = seq_k - seq_q` (the bottom-right diagonal) under `Causal::BottomRight`
    /// and `Causal::None`, and 0 under `Causal::TopLeft`. `None` leaves a side unbounded, and so
    /// does a side of at least `seq_q + seq_k`, which bounds nothing (such a window is no score
    /// modifier: CUTLASS example 41 runs the call too); a causal mask also bounds the right side
    /// at 0. Rows the window leaves without keys are
    /// [`crate::Error::NoVisibleKeys`], before anything runs. The CPU reference, the WMMA
    /// kernel and the Hopper kernel (`Kernel::CutlassSm90`, where `Backend::Auto` runs it for the plain call) apply it; the
    /// GPU kernels visit only the key tiles inside the band, so their time scales with the
    /// window, not with `seq_k`.
    ///
    /// ```
    /// use flashcore::{attention, AttentionOptions, Causal, Layout, Tensor};
    /// use half::f16;
    /// let x = Tensor::full(f16::ONE, &[1, 8, 1, 64], Layout::Bshd)?;
    /// // Mistral-style: each token sees itself and the 3 tokens before it.
    /// let opts = AttentionOptions::default().causal(Causal::BottomRight).window(Some(3), None);
    /// let r = attention(&x, &x, &x, &opts)?;
    /// # Ok::<(), flashcore::Error>(())
    /// ```
    pub fn window(&self, left: Option<usize>, right: Option<usize>) -> Self {
        Self {
            window: (left, right),
            ..self.clone()
        }
    }

    /// Sets ALiBi slopes (BLOOM, MPT): query head `h` of sequence `b` adds
    ///
    /// ```text
    /// -slopes[b][h] * |i + offset - j|
    /// ```
    ///
    /// to the score of query `i` and key `j`, after the scale and any softcap, with the
    /// window's `offset` (`seq_k - seq_q`, or 0 under `Causal::TopLeft`). See
    /// [`AlibiSlopes`] for their shapes; a GPU call needs them on the device
    /// (`AlibiSlopes::to_device`, feature `cuda`, else [`crate::Error::DeviceMismatch`]). The
    /// CPU reference, the WMMA kernel and the Hopper kernel (`Kernel::CutlassSm90`, where
    /// `Backend::Auto` runs it for the call without ALiBi) apply
    /// them; forcing another kernel is [`crate::Error::BackendUnavailable`].
    pub fn alibi(&self, slopes: AlibiSlopes) -> Self {
        Self {
            alibi: Some(slopes),
            ..self.clone()
        }
    }

    /// Sets an additive bias or mask: `bias[b, i, h, j]` is added to the score of query `i` and
    /// key `j` of sequence `b` and query head `h`, after the scale, any softcap and ALiBi. See
    /// [`Bias`] for its dims, broadcasting and element types; `-inf` masks, and a row whose
    /// every key is masked gets output 0 and logsumexp `-inf`. A GPU call needs it on the
    /// device (else [`crate::Error::DeviceMismatch`]). The CPU reference, the WMMA kernel and,
    /// with the `sm90-bias` feature, the Hopper kernel apply it (`Backend::Auto` picks as
    /// [`Bias`] says; forcing another kernel is [`crate::Error::BackendUnavailable`]).
    pub fn bias(&self, bias: Bias) -> Self {
        Self {
            bias: Some(bias),
            ..self.clone()
        }
    }

    /// Sets causal masking.
    pub fn causal(&self, causal: Causal) -> Self {
        Self {
            causal,
            ..self.clone()
        }
    }

    /// Chooses the backend.
    pub fn backend(&self, backend: Backend) -> Self {
        Self {
            backend,
            ..self.clone()
        }
    }

    /// Asks for the logsumexp output.
    pub fn with_lse(&self) -> Self {
        Self {
            return_lse: true,
            ..self.clone()
        }
    }

    /// Forces a tile-table class.
    pub fn force_arch_class(&self, class: ArchClass) -> Self {
        Self {
            force_arch_class: Some(class),
            ..self.clone()
        }
    }
}
