//! With the `cuda` feature, compile `src/gpu/kernels.cu` to PTX with `nvcc` (from `$NVCC`, `$CUDA_HOME/bin`, or the
//! PATH) for compute capability `$CUDA_COMPUTE_CAP` (default 90: H100/H200). No GPU is needed to build; the
//! driver loads the PTX at run time. Without the feature, nothing happens.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    println!("cargo:rerun-if-changed=src/gpu/kernels.cu");
    for var in ["NVCC", "CUDA_HOME", "CUDA_COMPUTE_CAP", "PATH"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let nvcc = std::env::var_os("NVCC")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("CUDA_HOME").map(|h| PathBuf::from(h).join("bin").join("nvcc")))
        .unwrap_or_else(|| PathBuf::from("nvcc"));
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "90".into());
    if cap.is_empty() || !cap.chars().all(|c| c.is_ascii_digit()) {
        panic!("CUDA_COMPUTE_CAP={cap:?}: give the compute capability as digits, e.g. 90 for H100/H200");
    }
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR")).join("kernels.ptx");
    let status = Command::new(&nvcc)
        .args(["--ptx", "-O3"])
        .arg(format!("-arch=compute_{cap}"))
        .arg("-o")
        .arg(&out)
        .arg("src/gpu/kernels.cu")
        .status()
        .unwrap_or_else(|e| {
            panic!(
                "the cuda feature needs nvcc ({}: {e}); scripts/install-cuda puts one in .tools/cuda, or set NVCC",
                nvcc.display()
            )
        });
    assert!(status.success(), "nvcc failed to compile src/gpu/kernels.cu ({status})");
    // Assemble the PTX for the target too, when ptxas is beside nvcc: errors the driver's JIT would hit at run time
    // (registers, unsupported instructions) fail the build instead. The cubin is not kept.
    if let Some(ptxas) = nvcc.parent().map(|d| d.join("ptxas")).filter(|p| p.is_file()) {
        let cubin = out.with_extension("cubin");
        let status = Command::new(&ptxas)
            .arg(format!("-arch=sm_{cap}"))
            .arg(&out)
            .arg("-o")
            .arg(&cubin)
            .status()
            .unwrap_or_else(|e| panic!("{}: {e}", ptxas.display()));
        assert!(status.success(), "ptxas refused the kernels' PTX for sm_{cap} ({status})");
    }
}
