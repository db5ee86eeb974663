//! The allocator's journal of the addresses its operations touch, for writing the status by what
//! changed ([`crate::patch`]).

use std::collections::BTreeSet;

/// The addresses changed since the status was last written whole; `None` before a first whole
/// write, or once an entry that is not an address (kept verbatim) changed: there is nothing to
/// journal it by, so the next write is whole.
#[derive(Debug, Clone, Default)]
pub(crate) struct Journal(Option<BTreeSet<u128>>);

/// Bookkeeping of writes, not allocation state: two allocators holding the same addresses are
/// equal whatever their journals say.
impl PartialEq for Journal {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Journal {}

impl Journal {
    pub(crate) fn touch(&mut self, value: u128) {
        if let Some(touched) = &mut self.0 {
            touched.insert(value);
        }
    }

    pub(crate) fn lose(&mut self) {
        self.0 = None;
    }

    /// Records from now on, from nothing.
    pub(crate) fn start(&mut self) {
        self.0 = Some(BTreeSet::new());
    }

    /// What was recorded since the last call, `None` when nothing records; recording goes on.
    pub(crate) fn take(&mut self) -> Option<BTreeSet<u128>> {
        self.0.as_mut().map(std::mem::take)
    }
}
