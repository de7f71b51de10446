//! Locks that shrug off poisoning. Every lock in zerolayer guards state that a panicking holder cannot leave
//! half-updated in a way later readers could misread (each mutation is one insert, remove or replace, or an apply
//! that validates before it writes), so a panic elsewhere must not turn every later request into a panic too.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Lock `m`, taking the guard even if a holder panicked.
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Read-lock `l`, taking the guard even if a writer panicked.
pub fn read<T: ?Sized>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

/// Write-lock `l`, taking the guard even if a holder panicked.
pub fn write<T: ?Sized>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_still_gives_its_value() {
        let (m, l) = (Mutex::new(1), RwLock::new(2));
        let _ = std::panic::catch_unwind(|| {
            let (_a, _b) = (m.lock(), l.write());
            panic!("poison both");
        });
        assert!(m.is_poisoned() && l.is_poisoned());
        assert_eq!(*lock(&m), 1);
        assert_eq!(*read(&l), 2);
        *write(&l) = 3;
        assert_eq!(*read(&l), 3);
    }
}
