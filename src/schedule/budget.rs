//! The traffic budget (docs/DESIGN.md §5): per target and for all targets together, at most
//! `max_inflight` streams at once, `max_rps` sends per second and `max_output_tokens_per_hour`
//! output tokens in any hour. Before a step, [`Budget::admit`] skips it on a target whose
//! `max_inflight` it would exceed (or whose hour is spent), runs the targets one after another
//! when together they would exceed the global `max_inflight`, and lowers an open-loop rate to
//! `max_rps`. Every send then takes a [`Grant`]: it waits for the `max_rps` pace and reserves
//! its requested output tokens, and a target whose hour is spent stops sending. Nothing is
//! silent: every change is a [`BudgetAction`] for the sinks (metrics, status, log).
//!
//! The probe stream has an allowance of its own ([`ProbeAllowance`]): its most per hour is taken
//! off the top of `max_output_tokens_per_hour`, the steps get the rest, and a probe is never
//! refused. So a spent hour pauses the steps, but the probes (and the availability SLO they
//! feed) go on, and the two together still stay within the limit.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::plan::{RatePlan, StepKind, StepPlan};
use super::target::Target;
use crate::config::Pairing;
use crate::model::{BudgetAction, BudgetReport, BudgetUsage};

/// The span of `max_output_tokens_per_hour`.
const HOUR: Duration = Duration::from_secs(3600);

/// The scope name of the global budget in metrics and status.
pub const GLOBAL_SCOPE: &str = "all";

/// One scope's limits; `None` is no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Limits {
    pub max_inflight: Option<u32>,
    pub max_rps: Option<f64>,
    pub max_output_tokens_per_hour: Option<u64>,
}

impl From<&crate::config::Budget> for Limits {
    fn from(b: &crate::config::Budget) -> Self {
        Limits {
            max_inflight: b.max_inflight.as_ref().map(|v| v.value),
            max_rps: b.max_rps.as_ref().map(|v| v.value),
            max_output_tokens_per_hour: b.max_output_tokens_per_hour.as_ref().map(|v| v.value),
        }
    }
}

impl Limits {
    pub fn is_empty(&self) -> bool {
        *self == Limits::default()
    }
}

/// What one scope has used.
#[derive(Debug, Default)]
struct Meter {
    limits: Limits,
    /// When the next send may leave under `max_rps`.
    next_send: Option<Instant>,
    /// Output tokens the steps received, by when, over the last hour; their sum.
    ledger: VecDeque<(Instant, u64)>,
    spent: u64,
    /// The same for the probe stream, which draws on its allowance instead.
    probe_ledger: VecDeque<(Instant, u64)>,
    probe_spent: u64,
    /// Tokens reserved by requests in flight.
    reserved: u64,
    throttled_requests: u64,
    throttled: Duration,
    /// A send was refused in the step in progress: the hour's tokens ran out.
    cut: bool,
}

/// Drops the entries of `ledger` older than an hour from it and from their sum.
fn expire(ledger: &mut VecDeque<(Instant, u64)>, sum: &mut u64, now: Instant) {
    while let Some((at, tokens)) = ledger.front().copied() {
        if now.saturating_duration_since(at) < HOUR {
            break;
        }
        ledger.pop_front();
        *sum -= tokens;
    }
}

impl Meter {
    fn expire(&mut self, now: Instant) {
        expire(&mut self.ledger, &mut self.spent, now);
        expire(&mut self.probe_ledger, &mut self.probe_spent, now);
    }

    /// The steps' share of `max_output_tokens_per_hour`: what the probe stream's allowance
    /// (`probes`, tokens an hour) leaves.
    fn load_cap(&self, probes: u64) -> Option<u64> {
        self.limits
            .max_output_tokens_per_hour
            .map(|cap| cap.saturating_sub(probes))
    }

    /// Whether `osl` more tokens of the steps fit in the hour.
    fn has_room(&self, osl: u64, probes: u64) -> bool {
        self.load_cap(probes)
            .is_none_or(|cap| self.spent + self.reserved + osl <= cap)
    }

    /// How long until `osl` tokens fit, as the ledger ages; `None` when they fit now or never
    /// can (more than the steps' whole share).
    fn room_in(&self, osl: u64, probes: u64, now: Instant) -> Option<Duration> {
        let cap = self.load_cap(probes)?;
        if self.has_room(osl, probes) || osl > cap {
            return None;
        }
        let mut over = self.spent + self.reserved + osl - cap;
        for (at, tokens) in &self.ledger {
            over = over.saturating_sub(*tokens);
            if over == 0 {
                return Some((*at + HOUR).saturating_duration_since(now));
            }
        }
        // Only reservations in flight stand in the way: look again in a minute.
        Some(Duration::from_secs(60))
    }

    fn usage(&self, scope: &str) -> BudgetUsage {
        BudgetUsage {
            scope: scope.to_owned(),
            max_inflight: self.limits.max_inflight,
            max_rps: self.limits.max_rps,
            max_output_tokens_per_hour: self.limits.max_output_tokens_per_hour,
            output_tokens_last_hour: self.spent + self.probe_spent,
            throttled_requests: self.throttled_requests,
            throttled_seconds: self.throttled.as_secs_f64(),
        }
    }
}

struct Inner {
    global: Meter,
    targets: HashMap<String, Meter>,
    per_target: HashMap<String, Limits>,
    /// The probe stream's output tokens an hour per target, kept from the steps.
    probes: ProbeAllowance,
    /// How many targets the probe stream sends to (the scheduler's set; the configured ones
    /// until it first says): the global scope keeps that many allowances.
    probed: Option<usize>,
}

impl Inner {
    /// The probe stream's share of the global scope's hour.
    fn global_probes(&self) -> u64 {
        let targets = self.probed.unwrap_or(self.per_target.len()) as u64;
        self.probes.tokens_per_hour.saturating_mul(targets)
    }

    fn meter(&mut self, target: &str) -> &mut Meter {
        let limits = self.per_target.get(target).copied().unwrap_or_default();
        self.targets
            .entry(target.to_owned())
            .or_insert_with(|| Meter {
                limits,
                ..Meter::default()
            })
    }
}

/// What the probe stream may spend in an hour on one target: one probe per interval, each
/// asking for its `osl`. Set only where a probe stream runs (the daemon), so the bench's steps
/// keep the whole budget.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProbeAllowance {
    pub tokens_per_hour: u64,
}

impl ProbeAllowance {
    /// The allowance of `probe` (none when it is off).
    pub fn of(probe: &crate::config::ProbeStreamConfig) -> ProbeAllowance {
        let interval = probe.interval.0.as_secs_f64();
        if !probe.enabled || interval <= 0.0 {
            return ProbeAllowance::default();
        }
        let probes = (HOUR.as_secs_f64() / interval).ceil() as u64;
        ProbeAllowance {
            tokens_per_hour: probes.saturating_mul(u64::from(*probe.osl)),
        }
    }
}

/// The budget of a run, shared by the scheduler and every send.
pub struct Budget {
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for Budget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Budget").finish_non_exhaustive()
    }
}

impl Default for Budget {
    fn default() -> Self {
        Budget::new(Limits::default(), HashMap::new())
    }
}

/// How a step runs under the budget.
#[derive(Debug, Clone, PartialEq)]
pub struct Admission {
    /// Indices (into the targets given) that run the step.
    pub targets: Vec<usize>,
    pub pairing: Pairing,
    /// The open-loop rate, lowered to `max_rps` where it was above.
    pub rate: Option<RatePlan>,
    pub actions: Vec<BudgetAction>,
    /// Every target was skipped because its hour is spent: the first has room again after this.
    pub wait: Option<Duration>,
}

/// The streams a step keeps open on one target.
pub fn streams(plan: &StepPlan) -> u32 {
    match (&plan.kind, plan.rate) {
        (StepKind::MultiTurn { conversations, .. }, _) => *conversations,
        (StepKind::Trace { max_inflight, .. }, _) => *max_inflight,
        (_, Some(rate)) => rate.max_inflight,
        (_, None) => plan.concurrency(),
    }
}

/// The largest output one request of the step asks for.
pub fn max_osl(plan: &StepPlan) -> u32 {
    match &plan.kind {
        StepKind::Sweep { osl, .. }
        | StepKind::MultiTurn { osl, .. }
        | StepKind::Prefix { osl, .. } => *osl,
        StepKind::Distribution { osl, .. } => osl.1,
        // Known once the step loads its trace; each send is still granted against the hour.
        StepKind::Trace { .. } => 1,
        StepKind::Dataset { osl, .. } => osl.unwrap_or(1),
    }
}

impl Budget {
    pub fn new(global: Limits, per_target: HashMap<String, Limits>) -> Budget {
        Budget {
            inner: Mutex::new(Inner {
                global: Meter {
                    limits: global,
                    ..Meter::default()
                },
                targets: HashMap::new(),
                per_target,
                probes: ProbeAllowance::default(),
                probed: None,
            }),
        }
    }

    /// Keeps `allowance` of every hour for the probe stream (the daemon, which runs one).
    pub fn keep_for_probes(&self, allowance: ProbeAllowance) {
        self.with(|i| i.probes = allowance);
    }

    /// The budget of `cfg`: its global `budget` and each target's.
    pub fn of(cfg: &crate::config::Config) -> Budget {
        let b = Budget::default();
        b.set_limits(cfg);
        b
    }

    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        f(&mut self.inner.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Takes the limits of `cfg` (a reload); what was used in the last hour still counts.
    pub fn set_limits(&self, cfg: &crate::config::Config) {
        let per_target: HashMap<String, Limits> = cfg
            .targets
            .iter()
            .map(|t| (t.name.value.clone(), Limits::from(&t.budget)))
            .collect();
        self.with(|i| {
            i.global.limits = Limits::from(&cfg.budget);
            for (name, meter) in &mut i.targets {
                meter.limits = per_target.get(name).copied().unwrap_or_default();
            }
            i.per_target = per_target;
        });
    }

    /// Whether any limit is set (without one, sends skip the budget entirely).
    fn limited(&self) -> bool {
        self.with(|i| !i.global.limits.is_empty() || i.per_target.values().any(|l| !l.is_empty()))
    }

    /// How `plan` runs on `targets` under the budget (see the module's doc).
    pub fn admit(&self, plan: &StepPlan, targets: &[Arc<Target>], pairing: Pairing) -> Admission {
        let now = Instant::now();
        let need = streams(plan);
        let osl = u64::from(max_osl(plan));
        self.with(|i| {
            let mut actions = Vec::new();
            let mut act = |target: &str, action: &'static str, detail: String| {
                actions.push(BudgetAction {
                    target: target.to_owned(),
                    workload: plan.workload,
                    action,
                    detail,
                });
            };
            i.global.expire(now);
            let global = i.global.limits;
            let (probes, global_probes) = (i.probes.tokens_per_hour, i.global_probes());
            let global_spent = !i.global.has_room(osl, global_probes);
            let mut run = Vec::new();
            let mut waits = Vec::new();
            for (k, t) in targets.iter().enumerate() {
                let meter = i.meter(&t.name);
                meter.expire(now);
                let (own_cap, own_room) = (meter.limits.max_inflight, meter.has_room(osl, probes));
                let (own_spent, own_tokens, own_wait) = (
                    meter.spent,
                    meter.load_cap(probes),
                    meter.room_in(osl, probes, now),
                );
                if let Some(cap) = own_cap.filter(|cap| need > *cap) {
                    act(&t.name, "skipped", format!("needs {need} streams; budget max_inflight {cap}"));
                } else if let Some(cap) = global.max_inflight.filter(|cap| need > *cap) {
                    act(&t.name, "skipped", format!("needs {need} streams; global budget max_inflight {cap}"));
                } else if !own_room || global_spent {
                    let (spent, cap, wait) = if global_spent {
                        (i.global.spent, i.global.load_cap(global_probes), i.global.room_in(osl, global_probes, now))
                    } else {
                        (own_spent, own_tokens, own_wait)
                    };
                    waits.push(wait.unwrap_or(HOUR));
                    let kept = if probes > 0 { " (the rest of the hour is the probe stream's)" } else { "" };
                    act(&t.name, "skipped", format!(
                        "{spent} of {} output tokens of the last hour spent{kept}",
                        cap.unwrap_or_default()
                    ));
                } else {
                    run.push(k);
                }
            }
            let mut pairing = pairing;
            if pairing == Pairing::Simultaneous
                && run.len() > 1
                && let Some(cap) = global.max_inflight
                && need * run.len() as u32 > cap
            {
                pairing = Pairing::Sequential;
                for &k in &run {
                    act(&targets[k].name, "serialized", format!(
                        "{} targets x {need} streams exceed the global budget max_inflight {cap}: one after another",
                        run.len()
                    ));
                }
            }
            let mut rate = plan.rate;
            if let Some(r) = &mut rate {
                let at_once = if pairing == Pairing::Simultaneous { run.len().max(1) } else { 1 };
                let mut cap = global.max_rps.map(|g| g / at_once as f64);
                for &k in &run {
                    let own = i.meter(&targets[k].name).limits.max_rps;
                    cap = match (cap, own) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                }
                if let Some(cap) = cap.filter(|cap| r.rps > *cap) {
                    for &k in &run {
                        act(&targets[k].name, "scaled", format!("open-loop rate {} rps lowered to the budget's {cap} rps", r.rps));
                    }
                    r.rps = cap;
                }
            }
            let wait = (run.is_empty() && !waits.is_empty() && waits.len() == targets.len())
                .then(|| waits.into_iter().min().unwrap_or(HOUR));
            Admission {
                targets: run,
                pairing,
                rate,
                actions,
                wait,
            }
        })
    }

    /// Takes the right to send one request of a step, of `osl` tokens, to `target`: waits for
    /// the pace of `max_rps` (the grant's instant is when it may leave) and reserves the tokens;
    /// `None` when the steps' share of the hour is spent (the sender stops for the rest of the
    /// step).
    pub async fn acquire(self: &Arc<Self>, target: &str, osl: u32) -> Option<Grant> {
        self.grant(target, osl, false).await
    }

    /// Takes the right to send one probe of the probe stream: paced with every other send to
    /// `max_rps`, its tokens booked on the probe stream's allowance, never refused (the stream
    /// itself holds it to one probe per target and interval).
    pub async fn acquire_probe(self: &Arc<Self>, target: &str, osl: u32) -> Grant {
        self.grant(target, osl, true)
            .await
            .expect("a probe is never refused")
    }

    async fn grant(self: &Arc<Self>, target: &str, osl: u32, probe: bool) -> Option<Grant> {
        let now = Instant::now();
        if !self.limited() {
            return Some(Grant::free(now));
        }
        let osl = u64::from(osl);
        let at = self.with(|i| {
            i.global.expire(now);
            let (probes, global_probes) = (i.probes.tokens_per_hour, i.global_probes());
            let global_room = i.global.has_room(osl, global_probes);
            let meter = i.meter(target);
            meter.expire(now);
            if !probe && (!global_room || !meter.has_room(osl, probes)) {
                meter.cut = true;
                return None;
            }
            let at = [meter.next_send, i.global.next_send]
                .into_iter()
                .flatten()
                .fold(now, Instant::max);
            // A probe reserves nothing: no limit waits on its tokens.
            let reserve = if probe { 0 } else { osl };
            let meter = i.meter(target);
            meter.reserved += reserve;
            pace(meter, at, now);
            i.global.reserved += reserve;
            pace(&mut i.global, at, now);
            Some(at)
        })?;
        let grant = Grant {
            budget: Some(Arc::clone(self)),
            target: target.to_owned(),
            osl: if probe { 0 } else { osl },
            probe,
            at,
            waited: at > now,
        };
        if at > now {
            tokio::time::sleep_until(at).await;
        }
        Some(grant)
    }

    /// Ends a grant: its reservation is replaced by the tokens actually received, on the steps'
    /// ledger or the probe stream's.
    fn settle(&self, target: &str, reserved: u64, received: u64, probe: bool) {
        let now = Instant::now();
        self.with(|i| {
            // The target's meter is gone when the target left while the request was in flight
            // (a probe may be, at any time): the global scope still books it.
            let own = i.targets.get_mut(target);
            for meter in std::iter::once(&mut i.global).chain(own) {
                meter.reserved -= reserved;
                if received > 0 {
                    let (ledger, sum) = if probe {
                        (&mut meter.probe_ledger, &mut meter.probe_spent)
                    } else {
                        (&mut meter.ledger, &mut meter.spent)
                    };
                    ledger.push_back((now, received));
                    *sum = sum.saturating_add(received);
                }
            }
        });
    }

    /// Forgets the meters of targets no longer measured (a target that comes back starts anew);
    /// `names` are the targets now, each with its probe stream's allowance.
    pub fn retain(&self, names: &[String]) {
        self.with(|i| {
            i.targets.retain(|n, _| names.contains(n));
            i.probed = Some(names.len());
        });
    }

    /// The targets whose sending a spent hour cut in the step just run (cleared by the call).
    pub fn take_cuts(&self) -> Vec<String> {
        self.with(|i| {
            let mut cut: Vec<String> = i
                .targets
                .iter_mut()
                .filter_map(|(name, m)| std::mem::take(&mut m.cut).then(|| name.clone()))
                .collect();
            cut.sort();
            cut
        })
    }

    /// The most streams a step may hold open on `target`: the lower of its own and the global
    /// `max_inflight`; `None` when neither is set. [`Budget::admit`] skips a step that needs more.
    pub fn max_streams(&self, target: &str) -> Option<u32> {
        self.with(|i| {
            let own = i.per_target.get(target).and_then(|l| l.max_inflight);
            match (own, i.global.limits.max_inflight) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            }
        })
    }

    /// The actions and every scope's use, for the sinks.
    pub fn report(&self, actions: Vec<BudgetAction>) -> BudgetReport {
        let now = Instant::now();
        self.with(|i| {
            i.global.expire(now);
            let mut usage = vec![i.global.usage(GLOBAL_SCOPE)];
            let mut names: Vec<&String> = i.targets.keys().collect();
            names.sort();
            usage.extend(names.into_iter().map(|n| i.targets[n].usage(n)));
            BudgetReport { actions, usage }
        })
    }
}

/// Books one send at `at` against `meter`'s pace.
fn pace(meter: &mut Meter, at: Instant, now: Instant) {
    if let Some(rps) = meter.limits.max_rps {
        meter.next_send = Some(at + Duration::from_secs_f64(1.0 / rps));
        if at > now {
            meter.throttled_requests += 1;
            meter.throttled += at - now;
        }
    }
}

/// The right to send one request; [`Grant::settle`] books what it received.
pub struct Grant {
    budget: Option<Arc<Budget>>,
    target: String,
    /// Tokens reserved.
    osl: u64,
    /// A probe's, booked on the probe stream's allowance.
    probe: bool,
    /// When the request may leave (later than asked when `max_rps` paced it).
    pub at: Instant,
    pub waited: bool,
}

impl Grant {
    fn free(now: Instant) -> Grant {
        Grant {
            budget: None,
            target: String::new(),
            osl: 0,
            probe: false,
            at: now,
            waited: false,
        }
    }

    /// The request ended having received `output_tokens`.
    pub fn settle(mut self, output_tokens: u64) {
        if let Some(b) = self.budget.take() {
            b.settle(&self.target, self.osl, output_tokens, self.probe);
        }
    }
}

impl Drop for Grant {
    /// A grant dropped unsettled (its send was cancelled) frees its reservation.
    fn drop(&mut self) {
        if let Some(b) = self.budget.take() {
            b.settle(&self.target, self.osl, 0, self.probe);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(inflight: Option<u32>, rps: Option<f64>, tokens: Option<u64>) -> Limits {
        Limits {
            max_inflight: inflight,
            max_rps: rps,
            max_output_tokens_per_hour: tokens,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn sends_are_paced_to_max_rps_across_scopes() {
        let budget = Arc::new(Budget::new(
            limits(None, Some(4.0), None),
            HashMap::from([("a".to_owned(), limits(None, Some(2.0), None))]),
        ));
        let t0 = Instant::now();
        let mut at = Vec::new();
        for target in ["a", "a", "b", "a"] {
            let g = budget.acquire(target, 10).await.unwrap();
            at.push((target, g.at.duration_since(t0)));
            g.settle(10);
        }
        let ms = |m: u64| Duration::from_millis(m);
        // `a` every 500 ms (its own 2 rps); `b` fits in the global 4 rps pace between them.
        assert_eq!(
            at,
            [
                ("a", ms(0)),
                ("a", ms(500)),
                ("b", ms(750)),
                ("a", ms(1000))
            ]
        );
        let usage = budget.report(Vec::new()).usage;
        assert_eq!(usage[0].scope, GLOBAL_SCOPE);
        assert_eq!(usage[0].output_tokens_last_hour, 40);
        assert_eq!(usage[1].throttled_requests, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn the_probe_streams_allowance_is_kept_from_the_steps_and_never_refused() {
        let probe = crate::config::ProbeStreamConfig::default();
        let allowance = ProbeAllowance::of(&probe);
        // One probe every 20 s, one token each.
        assert_eq!(allowance.tokens_per_hour, 180);
        let budget = Arc::new(Budget::new(limits(None, None, Some(1000)), HashMap::new()));
        budget.keep_for_probes(allowance);
        budget.retain(&["a".to_owned()]);
        // The steps get 1000 - 180 tokens of the hour.
        budget.acquire("a", 800).await.unwrap().settle(800);
        assert!(budget.acquire("a", 21).await.is_none());
        budget.acquire("a", 20).await.unwrap().settle(20);
        assert!(budget.acquire("a", 1).await.is_none());
        // The probes go on once the steps' share is spent, and are counted.
        for _ in 0..180 {
            budget.acquire_probe("a", 1).await.settle(1);
        }
        assert!(
            budget.acquire("a", 1).await.is_none(),
            "the probes took no step's room"
        );
        let usage = budget.report(Vec::new()).usage;
        assert_eq!(
            usage[0].output_tokens_last_hour, 1000,
            "within the limit, together"
        );
        assert_eq!(usage[1].output_tokens_last_hour, 1000);
        // The global scope keeps an allowance per target the stream probes.
        let global = Arc::new(Budget::new(limits(None, None, Some(1000)), HashMap::new()));
        global.keep_for_probes(allowance);
        global.retain(&["a".to_owned(), "b".to_owned()]);
        assert!(global.acquire("a", 641).await.is_none());
        assert!(global.acquire("b", 640).await.is_some());
        // A probe whose target leaves the set while it is in flight is booked globally.
        let in_flight = global.acquire_probe("b", 1).await;
        global.retain(&["a".to_owned()]);
        in_flight.settle(1);
        assert_eq!(
            global.report(Vec::new()).usage[0].output_tokens_last_hour,
            1
        );
        // Without a probe stream the steps have the whole hour.
        assert_eq!(
            ProbeAllowance::of(&crate::config::ProbeStreamConfig {
                enabled: false,
                ..probe
            }),
            ProbeAllowance::default()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_spent_hour_refuses_sends_until_tokens_age_out() {
        let budget = Arc::new(Budget::new(limits(None, None, Some(100)), HashMap::new()));
        let g = budget.acquire("a", 60).await.unwrap();
        // 60 reserved: another 60 does not fit while the first is in flight.
        assert!(budget.acquire("a", 60).await.is_none());
        g.settle(30);
        let g = budget.acquire("a", 60).await.unwrap();
        g.settle(60);
        assert!(budget.acquire("a", 20).await.is_none());
        assert_eq!(budget.take_cuts(), ["a"]);
        assert!(budget.take_cuts().is_empty(), "taken");
        tokio::time::advance(HOUR).await;
        assert!(budget.acquire("a", 20).await.is_some());
    }
}
