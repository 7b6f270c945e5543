//! Giving the heap a step freed back to the system. A step allocates its requests, bodies,
//! records and folded samples on every runtime thread and frees them when it ends; glibc keeps
//! what each thread's arena freed for reuse, and as steps differ in shape it keeps more, so an
//! always-on daemon's resident memory creeps up with memory it no longer uses (a soak of the
//! daemon alone: 17 MiB in use at every cycle's peak, 20 → 23 → 25 MiB held; docs/RELIABILITY.md).

/// Returns the heap's free pages to the system (glibc's `malloc_trim`), on the blocking pool so
/// no runtime worker waits on it, as a task of `tasks` (the run's tracker, so a stop awaits it);
/// nothing where the allocator is not glibc's.
// The crate denies unsafe code (Cargo.toml's `[lints]`); calling glibc's `malloc_trim` through
// its C interface is the one use, and this function its only scope.
#[allow(unsafe_code)]
pub fn release_freed(tasks: &tokio_util::task::TaskTracker) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    tasks.spawn_blocking(|| {
        // SAFETY: `malloc_trim` takes no pointer; it walks glibc's own arenas under their locks
        // and only gives back pages no allocation occupies.
        unsafe { libc::malloc_trim(0) };
    });
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = tasks;
}
