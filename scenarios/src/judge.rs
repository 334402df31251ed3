//! One judge for every scenario runner: the deterministic cluster (one sim or a world of
//! several) and real processes alike. A runner says what it saw through [`Observed`]; [`judge`]
//! turns a scenario's [`Expect`]ations into [`Verdict`]s the same way for all of them, and an
//! expectation a runner cannot observe fails with the reason (the file's checks refuse most
//! such combinations before a run starts).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::spec::{Expect, ExpectedRole, ExpectedStatus, Scenario};

/// One expectation's verdict (line 0: the check every run makes, that honest nodes agree).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Verdict {
    pub line: usize,
    pub what: String,
    pub ok: bool,
    pub detail: String,
}

/// How a step ended on one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepOutcome {
    Executed,
    Refused(String),
}

/// Whether the honest nodes agree on every tick two of them executed (within each sim).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Agreement {
    /// Tick roots compared.
    pub compared: u64,
    /// The first disagreement found, if any ("roots differ at tick T", "sim 2: …").
    pub differ: Option<String>,
    /// What was compared ("across 4 honest nodes", "within 3 sims").
    pub scope: String,
}

/// Crossings between sims, counted over the whole world.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Crossings {
    pub left: u64,
    pub arrived: u64,
    pub in_transit: u64,
    /// Objects found in two places at once.
    pub doubled: Vec<String>,
    /// Objects of the genesis found nowhere.
    pub lost: Vec<String>,
}

/// What a runner saw at the end of a run. Methods a runner cannot answer keep their default:
/// an error saying so, which fails the expectation.
pub trait Observed {
    /// How the always-made agreement check went.
    fn agreement(&self) -> Agreement;
    /// The ticks each judged node executed.
    fn ticks(&self) -> Vec<u64>;
    /// The ticks at which judged nodes diverged.
    fn desynced(&self) -> Vec<u64>;
    /// Objects in the world at the end.
    fn objects(&self) -> u64;
    /// The text the named object shows (`None`: no such object at the end).
    fn object_text(&self, name: &str) -> Result<Option<String>, String>;
    /// Whether each judged node saw a chat line containing `text`.
    fn chat_seen(&self, _text: &str) -> Result<Vec<bool>, String> {
        Err(self.cannot("chat"))
    }
    /// Each judged node's input latency in microseconds (an event taken in to its execution
    /// there), median and 99th percentile; `None` where it measured none.
    fn input_latency_us(&self) -> Result<Vec<Option<(u64, u64)>>, String> {
        Err(self.cannot("input latency"))
    }
    /// The step's outcome on each judged node; `None` if it was never submitted.
    fn outcomes(&self, _step: &str) -> Result<Option<Vec<Option<StepOutcome>>>, String> {
        Err(self.cannot("step outcomes"))
    }
    /// The role the account had at the tick (`admin`, `temp_admin`, `member`, or what the runner
    /// saw instead) and how it was seen, as the runner recorded it then (`None`: the sim never
    /// reached that tick).
    fn role_at(&self, _account: &str, _at_tick: u64) -> Result<Option<(String, String)>, String> {
        Err(self.cannot("roles"))
    }
    /// Whether the node noticed it diverged, and how it said so.
    fn noticed_desync(&self, _node: u16) -> Result<(bool, String), String> {
        Err(self.cannot("desyncs"))
    }
    /// Whether the node caught up from a certified snapshot (`joined`: as a new node; else a
    /// resync) and agrees since, and what was found.
    fn caught_up(&self, _node: u16, _joined: bool) -> Result<(bool, String), String> {
        Err(self.cannot("snapshot catch-ups"))
    }
    /// Whether the node votes at the end, and what it said (`None`: down).
    fn votes(&self, _node: u16) -> Result<Option<(bool, String)>, String> {
        Err(self.cannot("votes"))
    }
    /// The sims the named object is in at the end.
    fn sims_of(&self, _object: &str) -> Result<Vec<u32>, String> {
        Err(self.cannot("sims"))
    }
    /// Crossings between sims.
    fn crossings(&self) -> Result<Crossings, String> {
        Err(self.cannot("crossings"))
    }
    /// The most costly tick each judged node executed: (script operations, inputs queued).
    fn tick_costs(&self) -> Result<Vec<(u64, u64)>, String> {
        Err(self.cannot("tick costs"))
    }
    /// Whether the named object's script is suspended on each judged node (`None`: no such
    /// object or script there).
    fn suspended(&self, _object: &str) -> Result<Vec<Option<bool>>, String> {
        Err(self.cannot("scripts"))
    }
    /// Each judged node's world's structural check at the end.
    fn state_checks(&self) -> Result<Vec<Result<(), String>>, String> {
        Err(self.cannot("world state"))
    }
    /// "this runner cannot observe WHAT".
    fn cannot(&self, what: &str) -> String {
        format!("this runner cannot observe {what}")
    }
}

/// Whether every node saw the same outcome, of the wanted status, a refusal's reason holding
/// `reason`.
pub fn outcome_holds(got: &[Option<StepOutcome>], want: ExpectedStatus, reason: &str) -> bool {
    got.iter().all(|o| *o == got[0])
        && match got.first().and_then(Option::as_ref) {
            Some(StepOutcome::Executed) => want == ExpectedStatus::Executed,
            Some(StepOutcome::Refused(r)) => want == ExpectedStatus::Refused && r.contains(reason),
            None => false,
        }
}

/// A role as files and nodes write it.
pub fn role_name(r: ExpectedRole) -> &'static str {
    match r {
        ExpectedRole::Admin => "admin",
        ExpectedRole::TempAdmin => "temp_admin",
        ExpectedRole::Member => "member",
    }
}

/// Every verdict of a run: the agreement check (line 0), then each expectation in file order.
pub fn judge(spec: &Scenario, text: &str, seen: &dyn Observed) -> Vec<Verdict> {
    let agreement = seen.agreement();
    let agree_ok = agreement.differ.is_none();
    let agree_detail = agreement
        .differ
        .clone()
        .unwrap_or_else(|| format!("{} tick roots compared {}", agreement.compared, agreement.scope));
    let mut out = vec![Verdict {
        line: 0,
        what: "honest nodes agree (always checked)".into(),
        ok: agree_ok && agreement.compared > 0,
        detail: agree_detail.clone(),
    }];
    for e in &spec.expect {
        let line = Scenario::line_of(text, e.span());
        let verdict = |what: String, got: Result<(bool, String), String>| match got {
            Ok((ok, detail)) => Verdict { line, what, ok, detail },
            Err(why) => Verdict { line, what, ok: false, detail: why },
        };
        out.push(match e.get_ref() {
            Expect::RootsEqual => verdict(
                "roots equal on every honest node".into(),
                Ok((agree_ok && agreement.compared > 0, agree_detail.clone())),
            ),
            Expect::MinTicks { ticks } => {
                let got = seen.ticks();
                verdict(
                    format!("every honest node executed {ticks} ticks"),
                    Ok((!got.is_empty() && got.iter().all(|t| t >= ticks), format!("{got:?}"))),
                )
            }
            Expect::NoDesync => {
                let bad = seen.desynced();
                verdict("no honest node diverged".into(), Ok((bad.is_empty(), format!("{bad:?}"))))
            }
            Expect::Objects { count } => {
                let got = seen.objects();
                verdict(format!("{count} objects at the end"), Ok((got == *count, got.to_string())))
            }
            Expect::ObjectText { object, text } => verdict(
                format!("{object} shows {text:?}"),
                seen.object_text(object).map(|got| (got.as_deref() == Some(text.as_str()), format!("{got:?}"))),
            ),
            Expect::InputLatency { p50_ms, p99_ms } => verdict(
                match p99_ms {
                    Some(p99) => format!(
                        "input latency p50 ≤ {p50_ms} ms, p99 ≤ {p99} ms on every honest node that took events in"
                    ),
                    None => format!("input latency p50 ≤ {p50_ms} ms on every honest node that took events in"),
                },
                seen.input_latency_us().map(|got| {
                    let measured: Vec<(u64, u64)> = got.iter().flatten().copied().collect();
                    let within = |(p50, p99): &(u64, u64)| {
                        *p50 <= p50_ms * 1_000 && p99_ms.is_none_or(|bound| *p99 <= bound * 1_000)
                    };
                    let ok = !measured.is_empty() && measured.iter().all(within);
                    let shown: Vec<String> = got
                        .iter()
                        .map(|g| {
                            g.map_or("-".into(), |(p50, p99)| {
                                format!("{:.1}/{:.1}", p50 as f64 / 1e3, p99 as f64 / 1e3)
                            })
                        })
                        .collect();
                    (ok, format!("p50/p99 ms: [{}]", shown.join(", ")))
                }),
            ),
            Expect::ChatSeen { text } => verdict(
                format!("chat {text:?} seen"),
                seen.chat_seen(text).map(|s| (!s.is_empty() && s.iter().all(|x| *x), format!("on nodes: {s:?}"))),
            ),
            Expect::Outcome { step, status, reason } => {
                let want = match status {
                    ExpectedStatus::Executed => "executed",
                    ExpectedStatus::Refused => "refused",
                };
                verdict(
                    format!("step {step} {want}"),
                    seen.outcomes(step).map(|got| match got {
                        None => (false, "the step was never submitted".to_owned()),
                        Some(got) => {
                            (outcome_holds(&got, *status, reason), format!("{:?}", got.first().cloned().flatten()))
                        }
                    }),
                )
            }
            Expect::Role { account, role, at_tick } => verdict(
                format!("{account} is {} at tick {at_tick}", role_name(*role)),
                seen.role_at(account, *at_tick).map(|got| match got {
                    Some((r, how)) => (r == role_name(*role), format!("{r} {how}")),
                    None => (false, "the sim never reached that tick".to_owned()),
                }),
            ),
            Expect::Desync { node } => verdict(format!("node {node} noticed it diverged"), seen.noticed_desync(*node)),
            Expect::Resynced { node } => {
                verdict(format!("node {node} resynced and agrees"), seen.caught_up(*node, false))
            }
            Expect::Joined { node } => {
                verdict(format!("node {node} joined from a snapshot and agrees"), seen.caught_up(*node, true))
            }
            Expect::Validator { node } | Expect::Observer { node } => {
                let want = matches!(e.get_ref(), Expect::Validator { .. });
                verdict(
                    format!("node {node} {}", if want { "votes" } else { "only follows" }),
                    seen.votes(*node).map(|v| match v {
                        Some((votes, detail)) => (votes == want, detail),
                        None => (false, "down or not an honest node".to_owned()),
                    }),
                )
            }
            Expect::InSim { object, sim } => verdict(
                format!("{object} ends in sim {sim}"),
                seen.sims_of(object).map(|got| (got == [*sim], format!("in sims {got:?}"))),
            ),
            Expect::TickCost { max_operations, max_queued } => verdict(
                match max_queued {
                    Some(q) => format!("no tick ran over {max_operations} script operations or queued over {q} inputs"),
                    None => format!("no tick ran over {max_operations} script operations"),
                },
                seen.tick_costs().map(|costs| {
                    let ok = !costs.is_empty()
                        && costs
                            .iter()
                            .all(|(ops, queued)| ops <= max_operations && max_queued.is_none_or(|q| *queued <= q));
                    (ok, format!("most per node (operations, queued): {costs:?}"))
                }),
            ),
            Expect::Suspended { object } => verdict(
                format!("{object}'s script is suspended"),
                seen.suspended(object)
                    .map(|s| (!s.is_empty() && s.iter().all(|x| *x == Some(true)), format!("on nodes: {s:?}"))),
            ),
            Expect::StateValid => verdict(
                "every collection of the world within its bound".into(),
                seen.state_checks().map(|c| {
                    let bad: Vec<&String> = c.iter().filter_map(|r| r.as_ref().err()).collect();
                    (
                        !c.is_empty() && bad.is_empty(),
                        if bad.is_empty() { format!("{} nodes checked", c.len()) } else { format!("{bad:?}") },
                    )
                }),
            ),
            Expect::Handoffs { count } => verdict(
                format!("at least {count} bodies crossed between sims, each exactly once"),
                seen.crossings().map(|c| {
                    let ok = c.arrived >= *count
                        && c.left == c.arrived + c.in_transit
                        && c.doubled.is_empty()
                        && c.lost.is_empty();
                    let detail = format!(
                        "{} left, {} arrived, {} in transit; doubled {:?}, lost {:?}",
                        c.left, c.arrived, c.in_transit, c.doubled, c.lost
                    );
                    (ok, detail)
                }),
            ),
        });
    }
    out
}

/// Compare every pair of root maps on the ticks both hold: (ticks compared, first difference).
pub fn compare_roots<R: PartialEq>(roots: &[BTreeMap<u64, R>]) -> (u64, Option<u64>) {
    let mut compared = 0;
    for (i, a) in roots.iter().enumerate() {
        for b in &roots[i + 1..] {
            for (t, r) in a {
                if let Some(r2) = b.get(t) {
                    compared += 1;
                    if r != r2 {
                        return (compared, Some(*t));
                    }
                }
            }
        }
    }
    (compared, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run that saw only the nodes' input latencies.
    struct Latencies(Vec<Option<(u64, u64)>>);

    impl Observed for Latencies {
        fn agreement(&self) -> Agreement {
            Agreement { compared: 1, differ: None, scope: "across 1 honest node".into() }
        }
        fn ticks(&self) -> Vec<u64> {
            vec![10]
        }
        fn desynced(&self) -> Vec<u64> {
            Vec::new()
        }
        fn objects(&self) -> u64 {
            0
        }
        fn object_text(&self, _name: &str) -> Result<Option<String>, String> {
            Ok(None)
        }
        fn input_latency_us(&self) -> Result<Vec<Option<(u64, u64)>>, String> {
            Ok(self.0.clone())
        }
    }

    fn verdict(expect: &str, seen: Vec<Option<(u64, u64)>>) -> Verdict {
        let text = format!("name = \"t\"\nduration_secs = 1\n\n[[expect]]\nkind = \"input_latency\"\n{expect}\n");
        let spec = Scenario::parse(&text).unwrap();
        judge(&spec, &text, &Latencies(seen)).pop().unwrap()
    }

    #[test]
    fn input_latency_holds_its_median_and_its_99th_percentile_to_their_bounds() {
        let both = "p50_ms = 100\np99_ms = 200";
        let v = verdict(both, vec![Some((90_000, 180_000)), None, Some((100_000, 200_000))]);
        assert!(v.ok, "{v:?}");
        assert_eq!(v.detail, "p50/p99 ms: [90.0/180.0, -, 100.0/200.0]");
        // One node's p99 over its bound fails the line, whatever the medians.
        let v = verdict(both, vec![Some((90_000, 180_000)), Some((50_000, 200_001))]);
        assert!(!v.ok, "{v:?}");
        assert!(v.what.contains("p99 ≤ 200 ms"), "{}", v.what);
        // Without a p99 bound only the median counts.
        assert!(verdict("p50_ms = 100", vec![Some((100_000, 9_000_000))]).ok);
        assert!(!verdict("p50_ms = 100", vec![Some((100_001, 100_001))]).ok);
        // A run in which no node took an event in shows nothing: it fails.
        assert!(!verdict(both, vec![None, None]).ok);
    }
}
