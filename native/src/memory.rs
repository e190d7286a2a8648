//! Giving memory back: after a burst of load the allocator (glibc's malloc) keeps the pages of
//! freed buffers (connections' scratch buffers, the access lines and metric records held between
//! two takes, the answer a take is written into), so the process's resident size would stay at
//! its peak. A timer (`spawn_trimmer`) returns them to the system once the process has gone
//! quiet (no request recorded, no connection closed, since the last tick), or at once when the
//! free part of the heap is large; while requests flow it costs nothing per request.

use std::cell::Cell;
use std::time::Duration;

thread_local! {
    /// bumped by each request recorded and each connection closed (`note`)
    static ACTIVITY: Cell<u64> = const { Cell::new(0) };
}

/// How often the timer looks.
const TICK: Duration = Duration::from_secs(1);

/// Free heap bytes past which memory is returned even under load.
const FREE_LIMIT: usize = 8 << 20;

/// Something happened that may free memory soon (a request recorded, a connection closed).
#[inline]
pub fn note() {
    ACTIVITY.with(|a| a.set(a.get().wrapping_add(1)));
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod sys {
    #[repr(C)]
    pub struct MallInfo2 {
        pub arena: usize,
        pub ordblks: usize,
        pub smblks: usize,
        pub hblks: usize,
        pub hblkhd: usize,
        pub usmblks: usize,
        pub fsmblks: usize,
        pub uordblks: usize,
        pub fordblks: usize,
        pub keepcost: usize,
    }
    extern "C" {
        fn malloc_trim(pad: usize) -> i32;
        fn mallinfo2() -> MallInfo2;
        fn mallopt(param: i32, value: i32) -> i32;
    }
    const M_MMAP_THRESHOLD: i32 = -3;

    /// Large blocks (the answer of a take, a big access list) get pages of their own, returned
    /// when freed: a fixed threshold keeps glibc from raising it to the largest block freed
    /// (its default), after which such blocks stay in the heap.
    pub fn setup() {
        unsafe {
            mallopt(M_MMAP_THRESHOLD, 256 * 1024);
        }
    }

    /// Bytes free inside the heap (kept by the allocator, not in use).
    pub fn free_bytes() -> usize {
        unsafe { mallinfo2().fordblks }
    }

    pub fn trim() {
        unsafe {
            malloc_trim(0);
        }
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
mod sys {
    pub fn setup() {}
    pub fn free_bytes() -> usize {
        0
    }
    pub fn trim() {}
}

/// Set the allocator up (`sys::setup`); call once, before the runtime starts.
pub fn setup() {
    sys::setup();
}

/// The timer described above, on the current (local) runtime.
pub fn spawn_trimmer() {
    tokio::task::spawn_local(async {
        let mut seen = ACTIVITY.with(Cell::get);
        // whether anything happened since the last trim
        let mut dirty = true;
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let now = ACTIVITY.with(Cell::get);
            let quiet = now == seen;
            dirty |= !quiet;
            seen = now;
            if (quiet && dirty) || sys::free_bytes() > FREE_LIMIT {
                sys::trim();
                dirty = false;
            }
        }
    });
}
