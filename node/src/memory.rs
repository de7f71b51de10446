//! Giving large allocations back to the operating system. glibc's allocator serves big blocks with `mmap` and
//! unmaps them on free, but after the first such free it raises its threshold to that block's size, and from then
//! on blocks that big come from its heaps, which keep freed memory for reuse. A frontend that parsed three 30 MB
//! prompts would hold their memory for good. Fixing the threshold keeps every block of 1 MiB and more on `mmap`:
//! freed at once, at the cost of a system call per large allocation (large request bodies are rare and already
//! cost far more).

/// Blocks of this size and more are always mapped and unmapped on their own.
const MMAP_THRESHOLD: i32 = 1024 * 1024;

/// Keep large allocations returnable, as above (glibc only; elsewhere the allocator's own policy stands). Call it
/// once, early in `main`.
pub fn return_large_allocations() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        /// glibc's `M_MMAP_THRESHOLD` parameter of `mallopt`.
        const M_MMAP_THRESHOLD: i32 = -3;
        #[allow(unsafe_code)]
        // SAFETY: `mallopt` is glibc's documented, thread-safe tuning call; it takes two integers and touches
        // only the allocator's own settings. Setting the threshold explicitly also switches off its dynamic
        // adjustment, which is the point.
        unsafe extern "C" {
            fn mallopt(param: i32, value: i32) -> i32;
        }
        #[allow(unsafe_code)]
        // SAFETY: see above; the arguments are plain integers in the documented range.
        let ok = unsafe { mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) };
        if ok != 1 {
            eprintln!("warning: could not fix the allocator's mmap threshold; freed large buffers may be kept");
        }
    }
}
