//! Watching the story and checking its end: `Watch` takes in what the handlers report,
//! prints each line, and checks every user's outcome against the cast; `print_stats`
//! prints an endpoint's counters at the end.

use std::collections::HashSet;
use std::error::Error;

use chrono::{DateTime, Utc};
use courier::prelude::*;
use courier::{EndpointStats, RunningEndpoint, ShutdownReport};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::AUDIT_WAIT;
use crate::audit::{Audit, Audits};
use crate::setup::Scenario;
use crate::story::{News, Timing, clock_text};
use crate::users::{CAST, Member, Outcome, PersonaView, Step, login_id_of};
use crate::workflow::Refusal;

/// Prints what an endpoint did in this run.
pub(crate) fn print_stats(name: &str, s: &EndpointStats, report: &ShutdownReport) {
    let timeouts = if s.timeouts_dispatched > 0 {
        format!(
            "; saga timeouts: {} dispatched, {} of them discarded on arrival (cancelled after they were sent)",
            s.timeouts_dispatched, s.timeouts_discarded
        )
    } else {
        String::new()
    };
    println!(
        "{name:<8} handled {:>2} messages, dropped {} duplicates (inbox){timeouts}",
        report.completed, s.duplicates
    );
}

/// What `main` knows of one user.
#[derive(Debug)]
pub(crate) struct Watched {
    pub(crate) member: &'static Member,
    pub(crate) user_id: String,
    /// The latest Persona state heard of.
    pub(crate) persona: Option<PersonaView>,
    /// The checked steps heard of in this run, in order.
    pub(crate) steps: Vec<Step>,
    /// (message id, step) already counted: a retried handling tells its story again.
    pub(crate) seen: HashSet<(String, Step)>,
    /// What the last audit found: (saga, phase).
    pub(crate) found: Vec<(String, String)>,
    /// The endpoints that finished the last audit.
    pub(crate) audited: HashSet<String>,
}

/// `main`'s view of the story: prints it and checks it.
#[derive(Debug)]
pub(crate) struct Watch {
    pub(crate) started_at: DateTime<Utc>,
    pub(crate) timing: Timing,
    pub(crate) users: Vec<Watched>,
    /// Story lines printed.
    pub(crate) lines: usize,
    /// The audits: which one the replies must answer, how many answered another.
    pub(crate) audits: Audits,
}

impl Watch {
    pub(crate) fn new(scenario: &Scenario) -> Self {
        Self {
            started_at: scenario.started_at,
            timing: scenario.timing,
            lines: 0,
            audits: Audits::new(Utc::now().timestamp_millis()),
            users: CAST
                .iter()
                .map(|member| Watched {
                    member,
                    user_id: scenario.user_id(member.name),
                    persona: None,
                    steps: Vec::new(),
                    seen: HashSet::new(),
                    found: Vec::new(),
                    audited: HashSet::new(),
                })
                .collect(),
        }
    }

    pub(crate) fn user(&mut self, user_id: &str) -> Option<&mut Watched> {
        // News of other scenarios (left in a Postgres store) match no one: ignored.
        self.users.iter_mut().find(|w| w.user_id == user_id)
    }

    /// Takes one piece of news in: prints the story, records the rest.
    pub(crate) fn take(&mut self, news: News) {
        let (started_at, timing) = (self.started_at, self.timing);
        match news {
            News::Story {
                at,
                message_id,
                user_id,
                event,
            } => {
                let Some(w) = self.user(&user_id) else { return };
                if let Some(step) = event.step() {
                    if !w.seen.insert((message_id, step)) {
                        return;
                    }
                    w.steps.push(step);
                }
                let name = w.member.name;
                let since = at - started_at;
                self.lines += 1;
                println!(
                    "[{} sim | {:>6.2} s] {name:<5}  {}",
                    clock_text(timing.story(since)),
                    since.as_seconds_f64(),
                    event.text(timing)
                );
            }
            News::Persona(view) => self.persona(view),
            News::PersonaAudited { audit, view } => {
                if self.audits.answers_current(&audit) {
                    self.persona(view);
                }
            }
            News::Found {
                audit,
                user_id,
                saga,
                phase,
            } => {
                if self.audits.answers_current(&audit)
                    && let Some(w) = self.user(&user_id)
                    && !w.found.iter().any(|(s, p)| *s == saga && *p == phase)
                {
                    w.found.push((saga, phase)); // (once: a retried handling answers again)
                }
            }
            News::AuditDone {
                audit,
                endpoint,
                user_id,
            } => {
                if self.audits.answers_current(&audit)
                    && let Some(w) = self.user(&user_id)
                {
                    w.audited.insert(endpoint);
                }
            }
        }
    }

    /// Takes in a Persona's state, unless a later one is known.
    pub(crate) fn persona(&mut self, view: PersonaView) {
        if let Some(w) = self.user(&view.user_id)
            && w.persona.as_ref().is_none_or(|p| p.version <= view.version)
        {
            w.persona = Some(view);
        }
    }

    /// Takes news in until `done` holds; `Err` says what was still missing at `deadline`.
    pub(crate) async fn until(
        &mut self,
        news: &mut mpsc::UnboundedReceiver<News>,
        deadline: Instant,
        done: impl Fn(&Self) -> bool,
    ) -> Result<(), String> {
        while !done(self) {
            match tokio::time::timeout_at(deadline, news.recv()).await {
                Ok(Some(n)) => self.take(n),
                Ok(None) => return Err("the handlers' channel closed".to_owned()),
                Err(_) => return Err(self.standings()),
            }
        }
        Ok(())
    }

    pub(crate) fn all_settled(&self) -> bool {
        self.users
            .iter()
            .all(|w| w.persona.as_ref().is_some_and(|p| w.member.is_settled(p.outcome)))
    }

    pub(crate) fn standings(&self) -> String {
        let each: Vec<String> = self
            .users
            .iter()
            .map(|w| {
                let outcome = w.persona.as_ref().map_or(Outcome::Pending, |p| p.outcome);
                format!("{} {outcome}", w.member.name)
            })
            .collect();
        each.join(", ")
    }

    /// Audits every user on `endpoints` and waits for the answers to this audit.
    pub(crate) async fn audit(
        &mut self,
        endpoints: &[&RunningEndpoint],
        news: &mut mpsc::UnboundedReceiver<News>,
    ) -> Result<(), Box<dyn Error>> {
        let id = self.audits.begin();
        for w in &mut self.users {
            w.found.clear();
            w.audited.clear();
            for endpoint in endpoints {
                let audit = Audit {
                    audit: id.clone(),
                    user_id: w.user_id.clone(),
                    login_id: login_id_of(&w.user_id),
                };
                endpoint
                    .bus()
                    .send_with(&audit, SendOptions::new().to(endpoint.name()))
                    .await?;
            }
        }
        let names: Vec<&str> = endpoints.iter().map(|e| e.name()).collect();
        println!(
            "audit {id}: asked {} where each user's sagas stand",
            names.join(" and ")
        );
        let wanted = endpoints.len();
        self.until(news, Instant::now() + AUDIT_WAIT, |w| {
            w.users.iter().all(|u| u.audited.len() == wanted)
        })
        .await
        .map_err(|e| format!("the audit did not finish within {AUDIT_WAIT:?} ({e})"))?;
        Ok(())
    }

    /// Checks every user; prints a line each and says what differed.
    pub(crate) fn verdict(&self, whole_run: bool) -> Result<(), Box<dyn Error>> {
        println!();
        let mut problems = Vec::new();
        for w in &self.users {
            let name = w.member.name;
            let expected = w.member.expected_outcome();
            let mut wrong = Vec::new();
            // 1. The Persona's state: the outcome, and each mail received once.
            match &w.persona {
                None => wrong.push("no Persona state".to_owned()),
                Some(p) => {
                    if p.outcome != expected {
                        wrong.push(format!("ended {}, expected {expected}", p.outcome));
                    }
                    if p.mails != w.member.expected_mails() {
                        wrong.push(format!(
                            "received {} mails, expected {}",
                            p.mails,
                            w.member.expected_mails()
                        ));
                    }
                }
            }
            // 2. The accounts sagas' state: SignUp always completed; Login completed,
            //    except an expired one, which is kept.
            let expected_sagas: &[(&str, &str)] = if expected == Outcome::Refused(Refusal::CodeExpired) {
                &[("Login", "expired")]
            } else {
                &[]
            };
            let found: Vec<(&str, &str)> = w.found.iter().map(|(s, p)| (s.as_str(), p.as_str())).collect();
            if found != expected_sagas {
                wrong.push(format!(
                    "accounts sagas found {:?}, expected {expected_sagas:?}",
                    w.found
                ));
            }
            // 3. What the handlers told this run: all of it on a whole run, the end of it
            //    on a resumed one.
            let heard_ok = if whole_run {
                w.steps == w.member.expect
            } else {
                w.member.expect.ends_with(&w.steps)
            };
            if !heard_ok {
                wrong.push(format!(
                    "this run saw {:?}, expected {}{:?}",
                    w.steps,
                    if whole_run { "" } else { "an end of " },
                    w.member.expect
                ));
            }
            let sagas = if w.found.is_empty() {
                "no saga left in accounts".to_owned()
            } else {
                let each: Vec<String> = w.found.iter().map(|(s, p)| format!("{s} {p}")).collect();
                format!("accounts keeps {}", each.join(", "))
            };
            let (outcome, mails) = w
                .persona
                .as_ref()
                .map_or(("unknown".to_owned(), 0), |p| (p.outcome.to_string(), p.mails));
            println!(
                "{name:<5}  {outcome:<22} {mails} mail(s), {sagas:<36} {}",
                if wrong.is_empty() { "ok" } else { "WRONG" }
            );
            problems.extend(wrong.into_iter().map(|p| format!("{name}: {p}")));
        }
        if problems.is_empty() {
            println!(
                "ok: every user ended as the script says{}",
                if whole_run { "" } else { " (scenario resumed)" }
            );
            Ok(())
        } else {
            Err(format!("\n  - {}", problems.join("\n  - ")).into())
        }
    }
}
