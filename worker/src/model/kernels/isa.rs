//! The instruction-set level the kernels run on: detected once per process, lowered by `ZL_KERNEL_ISA`. A leaf:
//! `mod.rs` dispatches on it, the SIMD code asserts it.

/// The instruction set the kernels run on: the best this CPU has, or a lower one named by the environment variable
/// `ZL_KERNEL_ISA` (`portable`, `avx2`, `avx512` or `amx`; for comparisons and tests). Every level computes the same
/// bits: only the speed changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// Plain Rust, any CPU.
    Portable,
    /// AVX2, FMA and F16C (x86-64 since 2013-2015).
    Avx2,
    /// AVX2's, and AVX-512 F, BW, VL and VNNI (Intel since Cascade Lake and Ice Lake, AMD since Zen 4): the
    /// integer kernels' pair products as `vpdpwssd`. The other kernels run their AVX2 code.
    Avx512,
    /// AVX-512's, and AMX-TILE and AMX-INT8 (Intel since Sapphire Rapids) where the operating system grants the
    /// process the tile state: the repacked formats' matmuls of 16 batch rows or more on the tile unit (`x86/amx.rs`).
    Amx,
}

impl Isa {
    pub(super) const ALL: [Isa; 4] = [Isa::Portable, Isa::Avx2, Isa::Avx512, Isa::Amx];

    /// The name `ZL_KERNEL_ISA` takes.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Amx => "amx",
        }
    }

    /// The best level this CPU runs (detected once per process).
    pub fn detected() -> Isa {
        static DETECTED: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *DETECTED.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            {
                use std::arch::is_x86_feature_detected as has;
                if has!("avx2") && has!("fma") && has!("f16c") {
                    let vnni = has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512vnni");
                    let amx = vnni && has!("avx512dq") && amx_granted();
                    return if amx {
                        Isa::Amx
                    } else if vnni {
                        Isa::Avx512
                    } else {
                        Isa::Avx2
                    };
                }
            }
            Isa::Portable
        })
    }

    /// The SIMD levels a bit-for-bit test checks against the portable code: those this CPU runs (the others
    /// named on stderr as skipped, so a run on an older machine says what it did not check).
    #[cfg(test)]
    pub(super) fn simd_levels_here() -> Vec<Isa> {
        let (here, skipped): (Vec<Isa>, Vec<Isa>) =
            Isa::ALL.into_iter().filter(|&isa| isa >= Isa::Avx2).partition(|&isa| isa <= Isa::detected());
        for isa in skipped {
            eprintln!("skipped: the {} kernels (this CPU does not have them)", isa.name());
        }
        here
    }

    /// The level in use: [`Isa::detected`], lowered by `ZL_KERNEL_ISA` (a level above the CPU's, or an unknown
    /// name, is ignored with a warning). Read once per process.
    pub fn current() -> Isa {
        static CURRENT: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *CURRENT.get_or_init(|| {
            let detected = Isa::detected();
            let Ok(asked) = std::env::var("ZL_KERNEL_ISA") else { return detected };
            match Isa::ALL.into_iter().find(|isa| isa.name() == asked) {
                Some(isa) if isa <= detected => isa,
                _ => {
                    tracing::warn!(
                        asked,
                        detected = detected.name(),
                        "ZL_KERNEL_ISA is unknown or above this CPU's level; ignored"
                    );
                    detected
                }
            }
        })
    }
}

/// Whether the CPU has AMX-TILE and AMX-INT8 (CPUID leaf 7: EDX bits 24 and 25) and Linux lets this process use
/// the tile state: it keeps it off until a process asks (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`),
/// asked here once; a refusal (an older kernel, a hypervisor without it) leaves the AVX-512 level.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
fn amx_granted() -> bool {
    let leaf7 = std::arch::x86_64::__cpuid_count(7, 0);
    if (leaf7.edx >> 24) & 3 != 3 || !cfg!(target_os = "linux") {
        return false;
    }
    const SYS_ARCH_PRCTL: i64 = 158;
    const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
    const XFEATURE_XTILEDATA: i64 = 18;
    unsafe extern "C" {
        fn syscall(number: i64, ...) -> i64;
    }
    // SAFETY: glibc's `syscall` with `arch_prctl`'s documented request: it changes only which state the kernel lets
    // this process use, and reports a refusal by its return value.
    unsafe { syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
}
