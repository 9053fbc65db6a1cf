//! Options of an attention call.

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

/// Options of [`crate::attention`] and [`crate::attention_into`].
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct AttentionOptions {
    /// Softmax scale, positive and finite; `None` means `1 / sqrt(head_dim)`.
    pub scale: Option<f32>,
    /// Logit softcapping (Gemma 2, Grok): `scores = softcap * tanh(scale * q.k / softcap)`
    /// before the softmax; positive and finite ([`crate::Error::InvalidSoftcap`]). The CPU
    /// reference applies it; no GPU kernel does yet ([`crate::Error::BackendUnavailable`]).
    pub softcap: Option<f32>,
    /// Causal masking.
    pub causal: Causal,
    /// Which backend to run.
    pub backend: Backend,
    /// Also return the per-row logsumexp (natural log, f32, `[batch, heads, seq_q]`).
    pub return_lse: bool,
    /// Use this class's row of the backend's tile table instead of the device's own (e.g. to run the
    /// sm_89 tiles on an H200). The row must fit the device's shared memory.
    pub force_arch_class: Option<ArchClass>,
}

impl AttentionOptions {
    /// Sets the softmax scale.
    pub fn scale(mut self, scale: f32) -> Self {
        self.scale = Some(scale);
        self
    }

    /// Sets the logit softcap.
    pub fn softcap(mut self, cap: f32) -> Self {
        self.softcap = Some(cap);
        self
    }

    /// Sets causal masking.
    pub fn causal(mut self, causal: Causal) -> Self {
        self.causal = causal;
        self
    }

    /// Chooses the backend.
    pub fn backend(mut self, backend: Backend) -> Self {
        self.backend = backend;
        self
    }

    /// Asks for the logsumexp output.
    pub fn with_lse(mut self) -> Self {
        self.return_lse = true;
        self
    }

    /// Forces a tile-table class.
    pub fn force_arch_class(mut self, class: ArchClass) -> Self {
        self.force_arch_class = Some(class);
        self
    }
}
