//! The per-pool allocator: who holds which address, the release history, and the round-robin cursor.
//!
//! Observable behaviour is Harvester's (applicant ids `<lbNamespace>/<lbName>`, history reuse,
//! round-robin after `lastAllocated`, gateway skipped), with the listed defects fixed: an id that
//! already holds an address gets it back, and an unusable history address falls back to a fresh one.
//!
//! Ours: the addresses a pool skips ([`Skip`], set with [`PoolAllocator::set_skip`]) are never
//! handed out, fresh, from the history or on request; an id that holds one keeps it (a live
//! allocation is not churned). The status counters stay upstream's ([`PoolAllocator::total`],
//! [`PoolAllocator::available`]: skipped addresses counted, as upstream's controller counts them);
//! [`PoolAllocator::capacity`] and [`PoolAllocator::free`] count only what the pool hands out.
//!
//! Cost does not depend on the pool size. Held addresses are kept as coalesced runs in a `BTreeMap`,
//! so "the next free address after the cursor" jumps over a whole run in one O(log n) lookup instead of
//! walking it address by address; memory grows with allocations, history and ranges only. (With
//! `dot0And255`, a walk over held addresses steps once per /24 it crosses: the skipped `.255` and
//! `.0` break the runs.)

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use super::addr::{Family, family_of, from_key, key};
use super::range::{RangeError, RangeSet};
use super::skip::{SKIP_ADDRESSES, Skip};
use super::spec::RangeSpec;
use journal::Journal;

mod journal;

/// Why an address could not be reserved; the texts are those of the upstream allocator, which the
/// load balancer controller wraps as `fail to get ip from pool <pool>, error: <cause>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocateError {
    #[error("no IP addresses available in range set: {ranges}")]
    Exhausted { ranges: String },
    #[error("{ip} not in range set {ranges}")]
    NotInRange { ip: IpAddr, ranges: String },
    #[error("requested ip {ip} is subnet's gateway")]
    Gateway { ip: IpAddr },
    #[error("requested IP address {ip} is not available in range set {ranges}")]
    Taken {
        ip: IpAddr,
        holder: String,
        ranges: String,
    },
    /// Ours: the pool skips the address ([`Skip`]).
    #[error(
        "requested IP address {ip} is skipped by the pool's annotation {SKIP_ADDRESSES}: {skip}"
    )]
    Skipped { ip: IpAddr, skip: Skip },
    /// Only for a request of a specific address by an id that already holds another one: upstream
    /// would hand out a second address.
    #[error("{held} has been allocated to {id}, duplicate allocation is not allowed")]
    Duplicate { held: IpAddr, id: String },
}

/// A failed operation on one pool.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    #[error("invalid ranges for IP pool {pool}: {source}")]
    ParseRanges { pool: String, source: RangeError },
    #[error("fail to get ip from pool {pool}, error: {source}")]
    Allocate {
        pool: String,
        id: String,
        source: AllocateError,
    },
    /// The new ranges would leave a held address outside the pool (or make it the gateway).
    #[error("allocated IP {ip} is excluded")]
    Resize {
        pool: String,
        ip: String,
        id: String,
    },
}

/// An address handed to an applicant, with what the load balancer status needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    pub ip: IpAddr,
    /// The netmask of the range's subnet (`allocatedAddress.mask`, dotted for IPv4).
    pub mask: IpAddr,
    pub prefix_len: u8,
    /// The gateway of the range the address came from, if it has one.
    pub gateway: Option<IpAddr>,
    pub origin: Origin,
}

/// Where an allocated address came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The id already held it; nothing changed.
    Held,
    /// The id held it before and released it.
    History,
    /// The caller asked for this exact address.
    Requested,
    /// The next free address after `lastAllocated`.
    Fresh,
}

/// The addresses of one id, ascending. Almost always exactly one, which then needs no heap
/// allocation; `Many` always has at least two.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Addrs {
    One(u128),
    Many(Vec<u128>),
}

impl Addrs {
    pub(super) fn as_slice(&self) -> &[u128] {
        match self {
            Addrs::One(value) => std::slice::from_ref(value),
            Addrs::Many(values) => values,
        }
    }

    pub(super) fn insert(&mut self, value: u128) {
        match self {
            Addrs::One(v) if *v == value => {}
            Addrs::One(v) => *self = Addrs::Many(vec![(*v).min(value), (*v).max(value)]),
            Addrs::Many(values) => {
                if let Err(at) = values.binary_search(&value) {
                    values.insert(at, value);
                }
            }
        }
    }

    /// Removes `value`; true when nothing is left, so the caller drops the entry.
    pub(super) fn remove(&mut self, value: u128) -> bool {
        match self {
            Addrs::One(v) => *v == value,
            Addrs::Many(values) => {
                values.retain(|v| *v != value);
                if let [only] = values.as_slice() {
                    *self = Addrs::One(*only);
                }
                false
            }
        }
    }
}

/// One pool's allocation state. Build it with [`PoolAllocator::new`] or, after a restart, with
/// [`PoolAllocator::from_status`]; write it back with [`PoolAllocator::status`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolAllocator {
    pub(super) name: String,
    pub(super) ranges: RangeSet,
    /// The range set as error messages print it, computed once.
    pub(super) ranges_text: String,
    /// Every held address of the pool's family, usable or not. Hashed, not ordered: `runs` answers
    /// the ordered questions, and a hash lookup costs fewer cache misses than a tree walk.
    pub(super) by_ip: HashMap<u128, Arc<str>>,
    /// The addresses each id holds, ascending; more than one only in a restored, inconsistent status.
    pub(super) by_id: HashMap<Arc<str>, Addrs>,
    /// `by_ip` as maximal runs of consecutive addresses: start -> end, inclusive.
    pub(super) runs: BTreeMap<u128, u128>,
    /// Released addresses and their last holder. Every entry is usable and free.
    pub(super) history: HashMap<u128, Arc<str>>,
    /// The same per id, ascending; almost always a single address.
    pub(super) history_by_id: HashMap<Arc<str>, Addrs>,
    /// Status entries that are not addresses (or a second spelling of one), kept verbatim so that
    /// writing the status back loses nothing and nothing is handed out over them.
    pub(super) foreign: BTreeMap<String, String>,
    pub(super) last_allocated: Option<u128>,
    /// How many held addresses are usable (inside a range, not a gateway).
    pub(super) in_use: u128,
    /// How many of those the pool skips (held since before the pool skipped them).
    pub(super) held_skipped: u128,
    /// The addresses changed since the status was last written whole ([`crate::patch`]).
    pub(super) journal: Journal,
}

impl PoolAllocator {
    pub fn new(name: &str, ranges: &[RangeSpec]) -> Result<Self, PoolError> {
        let ranges = RangeSet::parse(ranges).map_err(|source| PoolError::ParseRanges {
            pool: name.into(),
            source,
        })?;
        Ok(Self::empty(name, ranges))
    }

    pub(super) fn empty(name: &str, ranges: RangeSet) -> Self {
        PoolAllocator {
            name: name.into(),
            ranges_text: ranges.to_string(),
            ranges,
            by_ip: HashMap::new(),
            by_id: HashMap::new(),
            runs: BTreeMap::new(),
            history: HashMap::new(),
            history_by_id: HashMap::new(),
            foreign: BTreeMap::new(),
            last_allocated: None,
            in_use: 0,
            held_skipped: 0,
            journal: Journal::default(),
        }
    }

    /// Skips what `skip` says from now on. Held addresses stay held; history addresses it skips
    /// stay in the history (as upstream keeps them) but are never handed out again.
    pub fn set_skip(&mut self, skip: Skip) {
        self.ranges.set_skip(skip);
        self.recount_skipped();
    }

    fn recount_skipped(&mut self) {
        self.held_skipped = self
            .by_ip
            .keys()
            .filter(|v| self.ranges.usable_value(**v) && !self.ranges.allocatable_value(**v))
            .count() as u128;
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn ranges(&self) -> &RangeSet {
        &self.ranges
    }

    /// Addresses the pool can hand out in all (the status `total`).
    pub fn total(&self) -> u128 {
        self.ranges.total()
    }

    /// Usable addresses nobody holds (the status `available`).
    pub fn available(&self) -> u128 {
        self.total().saturating_sub(self.in_use)
    }

    /// Usable addresses somebody holds.
    pub fn in_use(&self) -> u128 {
        self.in_use
    }

    /// What the pool skips.
    pub fn skip(&self) -> Skip {
        self.ranges.skip()
    }

    /// Addresses the pool hands out: [`total`](Self::total) less the skipped ones.
    pub fn capacity(&self) -> u128 {
        self.ranges.capacity()
    }

    /// Addresses the pool hands out that nobody holds: [`available`](Self::available) less the
    /// skipped ones.
    pub fn free(&self) -> u128 {
        self.capacity()
            .saturating_sub(self.in_use - self.held_skipped)
    }

    pub fn last_allocated(&self) -> Option<IpAddr> {
        self.last_allocated.map(|v| self.ip(v))
    }

    /// The id holding `ip`, if any.
    pub fn holder(&self, ip: IpAddr) -> Option<&str> {
        self.by_ip.get(&key(ip)).map(|id| &**id)
    }

    /// The usable address `id` holds, if any.
    pub fn address_of(&self, id: &str) -> Option<IpAddr> {
        self.usable_held(id).map(|v| self.ip(v))
    }

    /// The addresses `id` held before, ascending.
    pub fn history_of(&self, id: &str) -> Vec<IpAddr> {
        self.history_by_id
            .get(id)
            .map(|values| values.as_slice().iter().map(|&v| self.ip(v)).collect())
            .unwrap_or_default()
    }

    /// Held entries that the pool could not hand out today: outside the ranges, on a gateway, or not
    /// addresses. They only come from a restored status (hand edits, a spec
    /// changed behind the webhook), and stay held until released.
    pub fn strays(&self) -> Vec<(String, String)> {
        let mut held: Vec<(u128, &Arc<str>)> = self
            .by_ip
            .iter()
            .filter(|(v, _)| !self.ranges.usable_value(**v))
            .map(|(v, id)| (*v, id))
            .collect();
        held.sort_unstable_by_key(|(v, _)| *v);
        let mut out: Vec<(String, String)> = held
            .into_iter()
            .map(|(v, id)| (self.ip(v).to_string(), id.to_string()))
            .collect();
        out.extend(self.foreign.iter().map(|(ip, id)| (ip.clone(), id.clone())));
        out
    }

    /// Gives `id` an address: the one it holds, else the one it held before, else the next free one
    /// after `lastAllocated`.
    pub fn allocate(&mut self, id: &str) -> Result<Allocation, PoolError> {
        self.allocate_family(id, None)
    }

    /// As [`allocate`](Self::allocate), taking a remembered or fresh address only from the ranges
    /// of `family` (`None`: any). An address `id` already holds is kept whatever its family.
    pub fn allocate_family(
        &mut self,
        id: &str,
        family: Option<Family>,
    ) -> Result<Allocation, PoolError> {
        if let Some(held) = self.usable_held(id) {
            return Ok(self.allocation(held, Origin::Held));
        }
        // Every history entry is usable and free, so the first one can be taken as is; the loop is a
        // guard against a broken invariant, not a search.
        let remembered = self.history_by_id.get(id).and_then(|values| {
            values
                .as_slice()
                .iter()
                .copied()
                .find(|&v| self.is_free(v) && family.is_none_or(|f| family_of(v) == f))
        });
        if let Some(value) = remembered {
            self.reserve(id, value);
            return Ok(self.allocation(value, Origin::History));
        }
        match self.next_free(family) {
            Some(value) => {
                self.reserve(id, value);
                Ok(self.allocation(value, Origin::Fresh))
            }
            None => Err(self.fail(
                id,
                AllocateError::Exhausted {
                    ranges: self.ranges_text.clone(),
                },
            )),
        }
    }

    /// Gives `id` exactly `ip`, or says why not.
    pub(crate) fn allocate_ip(&mut self, id: &str, ip: IpAddr) -> Result<Allocation, PoolError> {
        let ip = ip.to_canonical();
        let value = key(ip);
        let Some(range) = self.ranges.range_of(value) else {
            return Err(self.fail(
                id,
                AllocateError::NotInRange {
                    ip,
                    ranges: self.ranges_text.clone(),
                },
            ));
        };
        if range.gateway_inside() == Some(value) {
            return Err(self.fail(id, AllocateError::Gateway { ip }));
        }
        let holder = self.by_ip.get(&value);
        if holder.is_some_and(|h| &**h == id) {
            // Held from before the pool skipped it: kept, not churned.
            return Ok(self.allocation(value, Origin::Held));
        }
        if !self.ranges.allocatable_value(value) {
            let skip = self.ranges.skip();
            return Err(self.fail(id, AllocateError::Skipped { ip, skip }));
        }
        if let Some(holder) = holder {
            let holder = holder.to_string();
            return Err(self.fail(
                id,
                AllocateError::Taken {
                    ip,
                    holder,
                    ranges: self.ranges_text.clone(),
                },
            ));
        }
        if let Some(held) = self.usable_held(id) {
            let held = self.ip(held);
            return Err(self.fail(
                id,
                AllocateError::Duplicate {
                    held,
                    id: id.into(),
                },
            ));
        }
        self.reserve(id, value);
        Ok(self.allocation(value, Origin::Requested))
    }

    /// Gives `id` exactly `ip` as [`allocate_ip`](Self::allocate_ip) does, but an `id` that holds
    /// another address of this pool moves: the old one goes into the history, and only once `ip` is
    /// known to be free, so a refused move keeps the old address.
    pub fn request_ip(&mut self, id: &str, ip: IpAddr) -> Result<Allocation, PoolError> {
        match self.allocate_ip(id, ip) {
            Err(PoolError::Allocate {
                source: AllocateError::Duplicate { .. },
                ..
            }) => {
                self.release(id);
                self.allocate_ip(id, ip)
            }
            other => other,
        }
    }

    /// Releases everything `id` holds into the history; returns what was released. Releasing an id
    /// that holds nothing is a no-op.
    pub fn release(&mut self, id: &str) -> Vec<IpAddr> {
        let mut released = Vec::new();
        if let Some(values) = self.by_id.remove(id) {
            for &value in values.as_slice() {
                if let Some(holder) = self.by_ip.remove(&value) {
                    self.unhold(value, holder);
                    released.push(self.ip(value));
                }
            }
        }
        if !self.foreign.is_empty() {
            let before = self.foreign.len();
            self.foreign.retain(|_, holder| holder != id);
            if self.foreign.len() != before {
                // A verbatim entry has no address to journal: the next write is whole.
                self.journal.lose();
            }
        }
        released
    }

    /// Releases one address, whoever holds it; returns the holder.
    pub(super) fn release_ip(&mut self, value: u128) -> Option<Arc<str>> {
        let holder = self.by_ip.remove(&value)?;
        if let Some(values) = self.by_id.get_mut(&*holder)
            && values.remove(value)
        {
            self.by_id.remove(&*holder);
        }
        self.unhold(value, holder.clone());
        Some(holder)
    }

    /// Replaces the ranges. Growing keeps every allocation; a change that would leave a held address
    /// outside the pool, or make it a gateway, is refused. History outside the new ranges is dropped.
    pub fn resize(&mut self, ranges: &[RangeSpec]) -> Result<(), PoolError> {
        let ranges = RangeSet::parse(ranges).map_err(|source| PoolError::ParseRanges {
            pool: self.name.clone(),
            source,
        })?;
        if let Some((&value, id)) = self
            .by_ip
            .iter()
            .filter(|(v, _)| !ranges.usable_value(**v))
            // The lowest offender, so that the message does not depend on hash order.
            .min_by_key(|(v, _)| **v)
        {
            return Err(PoolError::Resize {
                pool: self.name.clone(),
                ip: self.ip(value).to_string(),
                id: id.to_string(),
            });
        }
        // Only possible for a restored status; such an entry can never fit a range.
        if let Some((ip, id)) = self.foreign.iter().next() {
            return Err(PoolError::Resize {
                pool: self.name.clone(),
                ip: ip.clone(),
                id: id.clone(),
            });
        }
        self.ranges_text = ranges.to_string();
        self.ranges = ranges.with_skip(self.ranges.skip());
        self.in_use = self.by_ip.len() as u128;
        self.recount_skipped();
        let dropped: Vec<u128> = self
            .history
            .keys()
            .copied()
            .filter(|v| !self.ranges.usable_value(*v))
            .collect();
        for value in dropped {
            self.forget(value);
        }
        Ok(())
    }

    fn fail(&self, id: &str, source: AllocateError) -> PoolError {
        PoolError::Allocate {
            pool: self.name.clone(),
            id: id.into(),
            source,
        }
    }

    fn ip(&self, value: u128) -> IpAddr {
        from_key(value)
    }

    fn allocation(&self, value: u128, origin: Origin) -> Allocation {
        let range = self.ranges.range_of(value);
        let subnet = range.map(|r| r.subnet());
        Allocation {
            ip: self.ip(value),
            mask: subnet.map_or_else(|| host_mask(family_of(value)), |s| s.netmask()),
            prefix_len: subnet.map_or(family_of(value).bits(), |s| s.prefix_len()),
            gateway: range.and_then(|r| r.gateway()),
            origin,
        }
    }

    fn usable_held(&self, id: &str) -> Option<u128> {
        let held = self.by_id.get(id)?;
        held.as_slice()
            .iter()
            .copied()
            .find(|v| self.ranges.usable_value(*v))
    }

    /// Not held, and the pool may hand it out.
    fn is_free(&self, value: u128) -> bool {
        self.ranges.allocatable_value(value) && !self.by_ip.contains_key(&value)
    }

    /// Shares one allocation of the id string between the maps.
    fn intern(&self, id: &str) -> Arc<str> {
        if let Some((key, _)) = self.by_id.get_key_value(id) {
            return key.clone();
        }
        if let Some((key, _)) = self.history_by_id.get_key_value(id) {
            return key.clone();
        }
        Arc::from(id)
    }

    fn reserve(&mut self, id: &str, value: u128) {
        let key = self.intern(id);
        self.forget(value);
        self.journal.touch(value);
        self.by_ip.insert(value, key.clone());
        self.by_id
            .entry(key)
            .and_modify(|held| held.insert(value))
            .or_insert(Addrs::One(value));
        self.hold_run(value);
        if self.ranges.usable_value(value) {
            self.in_use += 1;
            if !self.ranges.allocatable_value(value) {
                self.held_skipped += 1;
            }
        }
        self.last_allocated = Some(value);
    }

    /// Bookkeeping after `value` left `by_ip` (and `by_id`).
    fn unhold(&mut self, value: u128, holder: Arc<str>) {
        self.journal.touch(value);
        self.free_run(value);
        if self.ranges.usable_value(value) {
            self.in_use -= 1;
            if !self.ranges.allocatable_value(value) {
                self.held_skipped -= 1;
            }
            self.remember(value, holder);
        }
    }

    fn remember(&mut self, value: u128, holder: Arc<str>) {
        self.forget(value);
        self.history_by_id
            .entry(holder.clone())
            .and_modify(|values| values.insert(value))
            .or_insert(Addrs::One(value));
        self.history.insert(value, holder);
    }

    fn forget(&mut self, value: u128) {
        let Some(old) = self.history.remove(&value) else {
            return;
        };
        self.journal.touch(value);
        if let Some(values) = self.history_by_id.get_mut(&*old)
            && values.remove(value)
        {
            self.history_by_id.remove(&*old);
        }
    }

    fn hold_run(&mut self, value: u128) {
        let mut start = value;
        let mut end = value;
        if let Some(prev) = value.checked_sub(1)
            && let Some((&s, &e)) = self.runs.range(..=prev).next_back()
            && e == prev
        {
            start = s;
        }
        if let Some(next) = value.checked_add(1)
            && let Some(e) = self.runs.remove(&next)
        {
            end = e;
        }
        self.runs.insert(start, end);
    }

    fn free_run(&mut self, value: u128) {
        let Some((&start, &end)) = self.runs.range(..=value).next_back() else {
            return;
        };
        if end < value {
            return;
        }
        self.runs.remove(&start);
        if start < value {
            self.runs.insert(start, value - 1);
        }
        if value < end {
            self.runs.insert(value + 1, end);
        }
    }

    /// The first address at or after `value` that nobody holds (it may lie outside every range).
    fn skip_held(&self, value: u128) -> Option<u128> {
        match self.runs.range(..=value).next_back() {
            Some((_, &end)) if end >= value => end.checked_add(1),
            _ => Some(value),
        }
    }

    /// The first free, non-gateway, not skipped address of range `index` within `[lo, hi]`.
    fn free_in(&self, index: usize, lo: u128, hi: u128) -> Option<u128> {
        let gateway = self.ranges.ranges()[index].gateway_inside();
        let mut at = lo;
        loop {
            let candidate = self.skip_held(at)?;
            if candidate > hi {
                return None;
            }
            if Some(candidate) != gateway && !self.ranges.skips_in(index, candidate) {
                return Some(candidate);
            }
            // Passed over: the gateway once, skipped addresses at most a few in a row.
            at = candidate.checked_add(1)?;
        }
    }

    /// Upstream's round robin: start after `lastAllocated` when it lies in a range (else at the first
    /// range's start), walk the ranges in spec order wrapping around, and try `lastAllocated` last.
    fn next_free(&self, family: Option<Family>) -> Option<u128> {
        let ranges = self.ranges.ranges();
        let count = ranges.len();
        // A request of one family skips the ranges of the other (a pool may mix them).
        let serves = |index: usize| family.is_none_or(|f| ranges[index].family() == f);
        let (first, from) = self
            .last_allocated
            .and_then(|last| {
                let index = self.ranges.find(last)?;
                let (_, end) = ranges[index].bounds();
                Some(if last < end {
                    (index, last + 1)
                } else {
                    let next = (index + 1) % count;
                    (next, ranges[next].bounds().0)
                })
            })
            .unwrap_or((0, ranges[0].bounds().0));

        let (start, end) = ranges[first].bounds();
        if serves(first)
            && let Some(found) = self.free_in(first, from, end)
        {
            return Some(found);
        }
        for step in 1..count {
            let index = (first + step) % count;
            if !serves(index) {
                continue;
            }
            let (start, end) = ranges[index].bounds();
            if let Some(found) = self.free_in(index, start, end) {
                return Some(found);
            }
        }
        if serves(first) && from > start {
            return self.free_in(first, start, from - 1);
        }
        None
    }
}

/// The all-ones mask of a family (a single address).
fn host_mask(family: Family) -> IpAddr {
    match family {
        Family::V4 => IpAddr::V4(std::net::Ipv4Addr::BROADCAST),
        Family::V6 => IpAddr::V6(std::net::Ipv6Addr::from(u128::MAX)),
    }
}

#[cfg(test)]
mod tests;
