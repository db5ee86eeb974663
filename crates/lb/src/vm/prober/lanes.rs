//! Who gets the prober's slots: one lane per load balancer, served in turn, each guaranteed a
//! share of the slots.
//!
//! Due targets leave the timer queue for their load balancer's lane. While slots are free every
//! lane takes one in turn (round-robin), so a load balancer with a thousand due targets does not
//! start them all before another's one. A lane's share is [`MAX_IN_FLIGHT`] divided by the load
//! balancers with targets (at least one): lanes below their share are served first, and when every
//! slot is taken and a lane below its share waits, probes of lanes above theirs are cancelled to
//! make room (the most recently started first: least work lost). A cancelled probe counts for
//! nothing; its target is due again at once. So a load balancer whose backends hang (or time out
//! slowly) holds at most the slots nobody else wants, and another's probe starts when it is due.

use std::{
    cmp::Reverse,
    collections::{BinaryHeap, HashMap, VecDeque},
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Health, LbRef, MAX_IN_FLIGHT, address::Refused};
use crate::vm::health::ProbeSettings;

/// What a target is doing.
pub(super) enum Run {
    /// In the timer queue.
    Idle,
    /// Due, in its lane.
    Waiting,
    /// Probing since `started`; `cancel` stops it.
    Running {
        cancel: CancellationToken,
        started: Instant,
    },
    /// Never probed: its address cannot be a VM's.
    Refused(Refused),
}

pub(super) struct Target {
    pub lb: LbRef,
    pub ip: IpAddr,
    pub settings: Arc<ProbeSettings>,
    pub due: Instant,
    pub run: Run,
    pub successes: u32,
    pub failures: u32,
    pub health: Health,
}

/// A probe to start.
pub(super) struct Job {
    pub id: u64,
    pub lb: LbRef,
    pub addr: SocketAddr,
    pub settings: Arc<ProbeSettings>,
    pub cancel: CancellationToken,
}

/// One load balancer's due targets and probes in flight.
#[derive(Default)]
struct Lane {
    waiting: VecDeque<u64>,
    in_flight: usize,
    /// Of `in_flight`, those cancelled and not returned yet.
    cancelling: usize,
    in_turns: bool,
    in_needy: bool,
}

impl Lane {
    fn over(&self, share: usize) -> bool {
        self.in_flight - self.cancelling > share
    }
}

#[derive(Default)]
pub(super) struct State {
    pub targets: HashMap<u64, Target>,
    pub by_lb: HashMap<LbRef, HashMap<IpAddr, u64>>,
    /// (due, target); entries of removed targets, or of an older due time, are skipped.
    pub queue: BinaryHeap<Reverse<(Instant, u64)>>,
    pub next_id: u64,
    lanes: HashMap<LbRef, Lane>,
    /// Lanes with waiting targets, in turn.
    turns: VecDeque<LbRef>,
    /// Lanes with waiting targets and fewer probes in flight than their share, in turn.
    needy: VecDeque<LbRef>,
    /// Slots each load balancer is guaranteed.
    share: usize,
    in_flight: usize,
    cancelling: usize,
    /// Lanes with more probes in flight (not cancelled) than their share.
    over: usize,
}

impl State {
    /// Applies `f` to `lb`'s lane (made if missing) and keeps the queues and counts in step.
    fn with_lane(&mut self, lb: &LbRef, f: impl FnOnce(&mut Lane)) {
        let share = self.share.max(1);
        let lane = self.lanes.entry(lb.clone()).or_default();
        let was_over = lane.over(share);
        f(lane);
        match (was_over, lane.over(share)) {
            (false, true) => self.over += 1,
            (true, false) => self.over -= 1,
            _ => {}
        }
        if !lane.waiting.is_empty() {
            if !lane.in_turns {
                lane.in_turns = true;
                self.turns.push_back(lb.clone());
            }
            if !lane.in_needy && lane.in_flight < share {
                lane.in_needy = true;
                self.needy.push_back(lb.clone());
            }
        }
        if lane.waiting.is_empty() && lane.in_flight == 0 && !lane.in_turns && !lane.in_needy {
            self.lanes.remove(lb);
        }
    }

    /// The share changes with the number of load balancers that have targets.
    pub(crate) fn reshare(&mut self) {
        let share = (MAX_IN_FLIGHT / self.by_lb.len().max(1)).max(1);
        if share == self.share {
            return;
        }
        self.share = share;
        self.over = self.lanes.values().filter(|l| l.over(share)).count();
        for (lb, lane) in &mut self.lanes {
            if !lane.in_needy && !lane.waiting.is_empty() && lane.in_flight < share {
                lane.in_needy = true;
                self.needy.push_back(lb.clone());
            }
        }
    }

    /// Forgets target `id`, cancelling its probe if one runs.
    pub(crate) fn drop_target(&mut self, id: u64) {
        let Some(t) = self.targets.remove(&id) else {
            return;
        };
        if let Run::Running { cancel, .. } = t.run {
            self.cancel(&t.lb, &cancel);
        }
    }

    fn cancel(&mut self, lb: &LbRef, cancel: &CancellationToken) {
        if cancel.is_cancelled() {
            return;
        }
        cancel.cancel();
        self.cancelling += 1;
        self.with_lane(lb, |l| l.cancelling += 1);
    }

    /// A probe of `lb` returned (`cancelled`: its token was cancelled, whatever it returned).
    pub fn finished(&mut self, lb: &LbRef, cancelled: bool) {
        self.in_flight -= 1;
        if cancelled {
            self.cancelling -= 1;
        }
        self.with_lane(lb, |l| {
            l.in_flight -= 1;
            if cancelled {
                l.cancelling -= 1;
            }
        });
    }

    /// Moves the targets due by `now` to their lanes; returns when the next one is due.
    fn take_due(&mut self, now: Instant) -> Option<Instant> {
        while let Some(&Reverse((due, id))) = self.queue.peek() {
            if due > now {
                return Some(due);
            }
            self.queue.pop();
            let Some(t) = self.targets.get_mut(&id) else {
                continue;
            };
            if t.due != due || !matches!(t.run, Run::Idle) {
                continue;
            }
            t.run = Run::Waiting;
            let lb = t.lb.clone();
            self.with_lane(&lb, |l| l.waiting.push_back(id));
        }
        None
    }

    /// Starts the first waiting target of `lb`'s lane, if it has one.
    fn start_one(&mut self, lb: &LbRef, now: Instant) -> Option<Job> {
        let lane = self.lanes.get_mut(lb)?;
        while let Some(id) = lane.waiting.pop_front() {
            let Some(t) = self.targets.get_mut(&id) else {
                continue;
            };
            if !matches!(t.run, Run::Waiting) {
                continue;
            }
            let cancel = CancellationToken::new();
            t.run = Run::Running {
                cancel: cancel.clone(),
                started: now,
            };
            let job = Job {
                id,
                lb: lb.clone(),
                addr: SocketAddr::new(t.ip, t.settings.port),
                settings: t.settings.clone(),
                cancel,
            };
            self.in_flight += 1;
            self.with_lane(lb, |l| l.in_flight += 1);
            return Some(job);
        }
        None
    }

    /// The probes to start now, and when the next target is due (`None`: nothing queued, or a
    /// finishing probe must make room first).
    pub(crate) fn schedule(&mut self, now: Instant) -> (Vec<Job>, Option<Instant>) {
        let next = self.take_due(now);
        let share = self.share.max(1);
        let mut jobs = Vec::new();
        // Lanes below their share first, then every lane, one probe per turn.
        for needy_pass in [true, false] {
            while self.in_flight < MAX_IN_FLIGHT {
                let queue = if needy_pass {
                    &mut self.needy
                } else {
                    &mut self.turns
                };
                let Some(lb) = queue.pop_front() else {
                    break;
                };
                if needy_pass && self.lanes.get(&lb).is_some_and(|l| l.in_flight >= share) {
                    // Stale: it got its share meanwhile.
                    if let Some(lane) = self.lanes.get_mut(&lb) {
                        lane.in_needy = false;
                    }
                    self.with_lane(&lb, |_| {});
                    continue;
                }
                let job = self.start_one(&lb, now);
                let Some(lane) = self.lanes.get_mut(&lb) else {
                    continue;
                };
                let again = !lane.waiting.is_empty() && (!needy_pass || lane.in_flight < share);
                if needy_pass {
                    lane.in_needy = again;
                } else {
                    lane.in_turns = again;
                }
                if again {
                    let queue = if needy_pass {
                        &mut self.needy
                    } else {
                        &mut self.turns
                    };
                    queue.push_back(lb.clone());
                }
                jobs.extend(job);
                // Drops the lane if nothing is left in it.
                self.with_lane(&lb, |_| {});
            }
        }
        if self.in_flight >= MAX_IN_FLIGHT {
            self.preempt(share);
        }
        (jobs, next)
    }

    /// Every slot is taken: cancels probes of lanes above their share for lanes below theirs.
    fn preempt(&mut self, share: usize) {
        if self.over == 0 || self.needy.is_empty() {
            return;
        }
        let wanted: usize = self
            .needy
            .iter()
            .filter_map(|lb| self.lanes.get(lb))
            .filter(|l| l.in_flight < share)
            .map(|l| (share - l.in_flight).min(l.waiting.len()))
            .sum();
        let mut needed = wanted.saturating_sub(self.cancelling);
        if needed == 0 {
            return;
        }
        let mut over: Vec<(usize, LbRef)> = self
            .lanes
            .iter()
            .filter(|(_, l)| l.over(share))
            .map(|(lb, l)| (l.in_flight - l.cancelling - share, lb.clone()))
            .collect();
        over.sort_by_key(|(excess, _)| Reverse(*excess));
        for (excess, lb) in over {
            if needed == 0 {
                break;
            }
            let mut running: Vec<(Instant, CancellationToken)> = self
                .by_lb
                .get(&lb)
                .into_iter()
                .flat_map(|ids| ids.values())
                .filter_map(|id| match &self.targets.get(id)?.run {
                    Run::Running { cancel, started } if !cancel.is_cancelled() => {
                        Some((*started, cancel.clone()))
                    }
                    _ => None,
                })
                .collect();
            // The most recently started first.
            running.sort_by_key(|(started, _)| Reverse(*started));
            for (_, cancel) in running.into_iter().take(excess.min(needed)) {
                self.cancel(&lb, &cancel);
                needed -= 1;
            }
        }
    }
}
