//! The families of disaggregated serving: the pod's role, the legs it served (never user
//! requests), how its user requests were served and the parts of their first token, and the
//! warnings a sidecar raises when it sits where it cannot see what the user waited for.

use super::native::ClassicAndNative;
use super::Registry;
use crate::metrics::buckets::Buckets;
use crate::record::{LabelText, LegPhase, Outcome, Reader, RequestRecord, Role, Served};
use crate::window::Ring;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use tracing::warn;

/// `role`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RoleLabels {
    role: &'static str,
}

/// `model`, `phase`, `outcome`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct LegOutcomeLabels {
    model: LabelText,
    phase: &'static str,
    outcome: &'static str,
}

/// `model`, `phase`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct LegLabels {
    model: LabelText,
    phase: &'static str,
}

/// `model`, `served`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ServedLabels {
    model: LabelText,
    served: &'static str,
}

/// `model`, `part`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct PartLabels {
    model: LabelText,
    part: &'static str,
}

/// `reason`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

/// `phase`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct PhaseLabels {
    phase: &'static str,
}

/// The window a placement warning is judged over.
const PLACEMENT_WINDOW: Duration = Duration::from_secs(5 * 60);
/// Requests of a kind a placement warning needs in its window: no single request raises one.
const PLACEMENT_MIN_REQUESTS: u64 = 5;
/// Share of the window's requests (legs and user requests) they must be, in percent.
const PLACEMENT_MIN_PERCENT: u64 = 10;

/// Why a sidecar's placement keeps it from seeing what the user waited for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// It sees decode legs (it sits behind the hop that owns the client's stream), so its
    /// TTFT leaves out prefill and the KV transfer.
    SeesDecodeLegs,
    /// Its role is `prefill`, yet a streamed user request came: the router sends users here.
    UserRequestOnPrefillPod,
}

impl Placement {
    /// Every warning, in the order of their counts in the window.
    const ALL: [Placement; 2] = [Placement::SeesDecodeLegs, Placement::UserRequestOnPrefillPod];
}

impl Placement {
    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Placement::SeesDecodeLegs => "sees_decode_legs",
            Placement::UserRequestOnPrefillPod => "user_request_on_prefill_pod",
        }
    }

    fn message(self) -> &'static str {
        match self {
            Placement::SeesDecodeLegs => {
                "this sidecar sees decode legs (kv_transfer_params or SGLang's bootstrap_room on a decode pod): \
                 its TTFT leaves out the prefill and the KV transfer; measure users where their stream enters: \
                 in front of llm-d's routing sidecar, SGLang's router or Dynamo's frontend \
                 (llmslo_placement_warning)"
            }
            Placement::UserRequestOnPrefillPod => {
                "role is prefill, yet a streamed user request came (no kv_transfer_params): it is measured as a \
                 user request; check the router sends users only to decode pods (llmslo_placement_warning)"
            }
        }
    }
}

/// The disaggregation families.
#[derive(Debug)]
pub struct DisaggFamilies {
    role: Role,
    /// Decode legs are what this pod is for (a router such as vLLM's or SGLang's sends them):
    /// they are no sign of a misplaced sidecar.
    decode_legs_expected: bool,
    legs: Family<LegOutcomeLabels, Counter>,
    leg_first_token: Family<LegLabels, Histogram, ClassicAndNative>,
    served: Family<ServedLabels, Counter>,
    ttft_parts: Family<PartLabels, Histogram, ClassicAndNative>,
    unmeasured_parts: Family<PartLabels, Counter>,
    relay_skipped: Family<ReasonLabels, Counter>,
    leg_fields_ignored: Family<PhaseLabels, Counter>,
    placement: Arc<PlacementWindow>,
}

/// The last few minutes of requests by what they say of the sidecar's placement: each warning's
/// count, then every request's.
#[derive(Debug)]
struct PlacementWindow {
    counts: Mutex<Ring<3>>,
    /// Whether each warning stood at the last look, so that a change is logged once.
    raised: Mutex<[bool; 2]>,
}

impl PlacementWindow {
    /// Notes one request (a leg or a user request), and whether it is a sign of `placement`.
    fn note(&self, placement: Option<Placement>) {
        let mut counts = [0, 0, 1];
        if let Some(placement) = placement {
            counts[placement as usize] = 1;
        }
        self.counts.lock().expect("placement lock").add(Instant::now(), counts);
    }

    /// The warnings that stand now: a sustained share of the window's requests, logged when
    /// one is raised and when it clears.
    fn standing(&self) -> [bool; 2] {
        let counts = self.counts.lock().expect("placement lock").sum(Instant::now());
        let mut raised = self.raised.lock().expect("placement lock");
        for placement in Placement::ALL {
            let i = placement as usize;
            let now = counts[i] >= PLACEMENT_MIN_REQUESTS && counts[i] * 100 >= counts[2] * PLACEMENT_MIN_PERCENT;
            if now != std::mem::replace(&mut raised[i], now) {
                if now {
                    warn!(requests = counts[i], of = counts[2], "{}", placement.message());
                } else {
                    warn!(
                        reason = placement.as_str(),
                        "the placement warning cleared: no such requests of late"
                    );
                }
            }
        }
        *raised
    }
}

/// `llmslo_placement_warning`, judged at each scrape over the last minutes.
#[derive(Debug)]
struct PlacementCollector(Arc<PlacementWindow>);

impl Collector for PlacementCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let standing = self.0.standing();
        let mut family = encoder.encode_descriptor(
            "llmslo_placement_warning",
            "1 while the sidecar sits where it cannot see what users waited for, by reason: a sustained share \
             of the last 5 minutes' requests",
            None,
            MetricType::Gauge,
        )?;
        for placement in Placement::ALL.into_iter().filter(|p| standing[*p as usize]) {
            let labels = ReasonLabels {
                reason: placement.as_str(),
            };
            ConstGauge::new(1).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

impl DisaggFamilies {
    /// The families of a pod in `role` (a decode pod whose config names the routers that send
    /// it decode legs when `routers_send_decode_legs`), with `ttft` as the latency edges,
    /// registered in `registry`.
    pub fn new(role: Role, routers_send_decode_legs: bool, ttft: Buckets, registry: &mut Registry) -> Self {
        let families = Self {
            role,
            decode_legs_expected: role == Role::Decode && routers_send_decode_legs,
            legs: Family::default(),
            leg_first_token: Family::new_with_constructor(ClassicAndNative(ttft.clone())),
            served: Family::default(),
            ttft_parts: Family::new_with_constructor(ClassicAndNative(ttft)),
            unmeasured_parts: Family::default(),
            relay_skipped: Family::default(),
            leg_fields_ignored: Family::default(),
            placement: Arc::new(PlacementWindow {
                counts: Mutex::new(Ring::new(PLACEMENT_WINDOW, Instant::now())),
                raised: Mutex::default(),
            }),
        };
        let roles: Family<RoleLabels, Gauge> = Family::default();
        roles.get_or_create(&RoleLabels { role: role.as_str() }).set(1);
        let r = registry.families();
        r.register(
            "llmslo_role",
            "The pod's role in disaggregated serving (aggregated, prefill, decode, or router in front of a P/D router), always 1",
            roles,
        );
        r.register(
            "llmslo_legs",
            "Legs of disaggregated requests this pod's engine served (kv_transfer_params): never user requests",
            families.legs.clone(),
        );
        r.register_with_unit(
            "llmslo_leg_first_token",
            "A leg's wait for its first token: a prefill leg's whole answer, a decode leg's first streamed token",
            Unit::Seconds,
            families.leg_first_token.clone(),
        );
        r.register(
            "llmslo_requests_served",
            "User requests by how they were served: disaggregated (the router named a prefill pod, or a P/D router \
             behind llmslo served it), decode_only, aggregated",
            families.served.clone(),
        );
        r.register_with_unit(
            "llmslo_ttft_part",
            "The parts of a disaggregated request's TTFT: prefill (the leg), decode_queue, kv_transfer \
             (the decode engine's scheduling to first token), coordination (the rest)",
            Unit::Seconds,
            families.ttft_parts.clone(),
        );
        r.register(
            "llmslo_ttft_part_unmeasured",
            "Disaggregated requests whose TTFT part could not be measured (never estimated)",
            families.unmeasured_parts.clone(),
        );
        r.register(
            "llmslo_prefill_relay_skipped",
            "Requests whose prefill leg the relay left to the routing sidecar, untimed, by reason: not_one_address \
             (several pods, or not an address:port), outside_pool (an address only the request named)",
            families.relay_skipped.clone(),
        );
        r.register(
            "llmslo_leg_fields_ignored",
            "User requests carrying a leg's fields (kv_transfer_params, bootstrap_room) where no such leg is \
             expected (the pod's role, or a decode leg from outside the pod): counted in full as user requests",
            families.leg_fields_ignored.clone(),
        );
        r.register_collector(Box::new(PlacementCollector(families.placement.clone())));
        families
    }

    /// Counts a finished leg.
    fn count_leg(&self, record: &RequestRecord, phase: LegPhase) {
        let labels = LegLabels {
            model: record.model.clone(),
            phase: phase.as_str(),
        };
        self.legs
            .get_or_create(&LegOutcomeLabels {
                model: record.model.clone(),
                phase: phase.as_str(),
                outcome: record.outcome.as_str(),
            })
            .inc();
        let first_token = match phase {
            LegPhase::Prefill => (record.outcome == Outcome::Success).then_some(record.e2e),
            LegPhase::Decode => record.ttft,
        };
        if let Some(wait) = first_token {
            self.leg_first_token.get_or_create(&labels).observe(wait.as_secs_f64());
        }
        let misplaced = phase == LegPhase::Decode && !self.decode_legs_expected;
        self.placement.note(misplaced.then_some(Placement::SeesDecodeLegs));
    }
}

impl Reader for DisaggFamilies {
    fn leg_finished(&self, record: &RequestRecord, phase: LegPhase) {
        self.count_leg(record, phase);
    }

    fn finished(&self, record: &RequestRecord) {
        // A pod without a role that is sent decode legs sits behind the hop that owns the stream.
        let sign = match self.role {
            Role::Prefill if record.count_source.is_some() => Some(Placement::UserRequestOnPrefillPod),
            Role::Aggregated | Role::Router if record.leg_fields_ignored == Some(LegPhase::Decode) => {
                Some(Placement::SeesDecodeLegs)
            }
            _ => None,
        };
        self.placement.note(sign);
        if let Some(phase) = record.leg_fields_ignored {
            self.leg_fields_ignored
                .get_or_create(&PhaseLabels { phase: phase.as_str() })
                .inc();
        }
        if let Some(skip) = record.relay_skipped {
            self.relay_skipped
                .get_or_create(&ReasonLabels { reason: skip.as_str() })
                .inc();
        }
        let Some(served) = record.served else {
            return;
        };
        if self.role != Role::Aggregated || served != Served::Aggregated {
            self.served
                .get_or_create(&ServedLabels {
                    model: record.model.clone(),
                    served: served.as_str(),
                })
                .inc();
        }
        let Some(parts) = record.ttft_parts else {
            return;
        };
        for (part, value) in parts.each() {
            let labels = PartLabels {
                model: record.model.clone(),
                part: part.as_str(),
            };
            // Every part's unmeasured count exists, at zero while each is measured.
            let unmeasured = self.unmeasured_parts.get_or_create(&labels);
            match value {
                Some(seconds) => self.ttft_parts.get_or_create(&labels).observe(seconds),
                None => {
                    unmeasured.inc();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::buckets::{self, Buckets};
    use crate::record::{CountSource, Operation, TtftParts};
    use std::time::Duration;

    fn families(role: Role) -> (DisaggFamilies, Registry) {
        let mut registry = Registry::default();
        let families = DisaggFamilies::new(role, false, Buckets::new(None, buckets::TTFT, &[]), &mut registry);
        (families, registry)
    }

    fn streamed() -> RequestRecord {
        let mut record = RequestRecord::new("m".into(), Operation::Chat, Duration::from_millis(900));
        record.count_source = Some(CountSource::Usage);
        record.ttft = Some(Duration::from_millis(300));
        record
    }

    #[tokio::test(start_paused = true)]
    async fn a_prefill_pod_given_streamed_user_requests_says_so_while_they_last() {
        let (families, registry) = families(Role::Prefill);
        let metrics = registry.into_metrics(None);
        families.leg_finished(&streamed(), LegPhase::Prefill);
        families.finished(&streamed());
        let text = metrics.encode();
        assert!(text.contains("llmslo_role{role=\"prefill\"} 1"), "{text}");
        assert!(
            !text.contains("llmslo_placement_warning{"),
            "no single request raises it: {text}"
        );
        assert!(text.contains("llmslo_legs_total{model=\"m\",phase=\"prefill\",outcome=\"success\"} 1"));
        for _ in 0..4 {
            families.finished(&streamed());
        }
        let text = metrics.encode();
        assert!(text.contains("llmslo_placement_warning{reason=\"user_request_on_prefill_pod\"} 1"));
        assert!(!text.contains("sees_decode_legs"), "a prefill leg is where it belongs");
        // A trickle beside the legs is no sustained share: 5 of 100 is 5 %.
        tokio::time::advance(PLACEMENT_WINDOW + Duration::from_secs(10)).await;
        assert!(
            !metrics.encode().contains("llmslo_placement_warning{"),
            "it clears when they stop"
        );
        for _ in 0..95 {
            families.leg_finished(&streamed(), LegPhase::Prefill);
        }
        for _ in 0..5 {
            families.finished(&streamed());
        }
        assert!(!metrics.encode().contains("llmslo_placement_warning{"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_sidecar_seeing_decode_legs_says_so_and_counts_them_as_legs() {
        let (families, registry) = families(Role::Aggregated);
        let metrics = registry.into_metrics(None);
        families.leg_finished(&streamed(), LegPhase::Decode);
        families.leg_finished(&streamed(), LegPhase::Decode);
        let text = metrics.encode();
        assert!(!text.contains("llmslo_placement_warning{"), "{text}");
        assert!(text.contains("llmslo_legs_total{model=\"m\",phase=\"decode\",outcome=\"success\"} 2"));
        assert!(text.contains("llmslo_leg_first_token_seconds_sum{model=\"m\",phase=\"decode\"} 0.6"));
        assert!(!text.contains("llmslo_requests_served_total{"), "no user request");
        for _ in 0..3 {
            families.leg_finished(&streamed(), LegPhase::Decode);
        }
        assert!(metrics
            .encode()
            .contains("llmslo_placement_warning{reason=\"sees_decode_legs\"} 1"));
    }

    #[test]
    fn an_aggregated_pods_own_requests_are_not_counted_twice_but_a_disaggregated_one_is_split() {
        let (families, registry) = families(Role::Aggregated);
        let mut plain = streamed();
        plain.served = Some(Served::Aggregated);
        families.finished(&plain);
        let mut split = streamed();
        split.served = Some(Served::Disaggregated);
        split.ttft_parts = Some(TtftParts::split(
            Duration::from_millis(300),
            Some(Duration::from_millis(200)),
            None,
        ));
        families.finished(&split);
        let text = registry.into_metrics(None).encode();
        assert!(!text.contains("served=\"aggregated\""), "{text}");
        assert!(text.contains("llmslo_requests_served_total{model=\"m\",served=\"disaggregated\"} 1"));
        assert!(text.contains("llmslo_ttft_part_seconds_count{model=\"m\",part=\"prefill\"} 1"));
        assert!(text.contains("llmslo_ttft_part_unmeasured_total{model=\"m\",part=\"decode_queue\"} 1"));
        assert!(text.contains("llmslo_ttft_part_unmeasured_total{model=\"m\",part=\"prefill\"} 0"));
    }
}
