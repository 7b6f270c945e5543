//! Turns a [`FaultSpec`] into the faults one request suffers: each configured kind is drawn with
//! its rate from the deployment's seeded generator, so a run is reproducible.

use std::time::Duration;

use crate::config::sim::FaultSpec;

/// The faults one request gets.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FaultPlan {
    pub error_status: Option<u16>,
    pub slow_first_byte: Option<Duration>,
    /// Pause `duration` after this many tokens.
    pub stall: Option<(u32, Duration)>,
    /// End after this many tokens without `[DONE]`; `true` = reset the connection.
    pub truncate: Option<(u32, bool)>,
    /// Send a broken chunk after this many tokens.
    pub malformed_after: Option<u32>,
    /// Send `event: error` after this many tokens, then end.
    pub error_event: Option<(u32, String)>,
}

impl FaultPlan {
    /// Draws the plan; `draw` yields uniform numbers in [0, 1).
    pub fn sample(spec: &FaultSpec, mut draw: impl FnMut() -> f64) -> FaultPlan {
        let mut hit = |rate: f64| rate >= 1.0 || (rate > 0.0 && draw() < rate);
        let mut plan = FaultPlan::default();
        if let Some(f) = &spec.error
            && hit(f.rate)
        {
            plan.error_status = Some(f.status);
        }
        if let Some(f) = &spec.slow_first_byte
            && hit(f.rate)
        {
            plan.slow_first_byte = Some(f.delay);
        }
        if let Some(f) = &spec.stall
            && hit(f.rate)
        {
            plan.stall = Some((f.after_tokens, f.duration));
        }
        if let Some(f) = &spec.truncate
            && hit(f.rate)
        {
            plan.truncate = Some((f.after_tokens, f.abrupt));
        }
        if let Some(f) = &spec.malformed_chunk
            && hit(f.rate)
        {
            plan.malformed_after = Some(f.after_tokens);
        }
        if let Some(f) = &spec.error_event
            && hit(f.rate)
        {
            plan.error_event = Some((f.after_tokens, f.message.clone()));
        }
        plan
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::sim::ErrorFault;

    #[test]
    fn rate_selects_the_expected_share() {
        let spec = FaultSpec {
            error: Some(ErrorFault {
                rate: 0.25,
                status: 429,
            }),
            ..FaultSpec::default()
        };
        let mut x = 0.0;
        let mut draw = || {
            x = (x + 0.1) % 1.0;
            x
        };
        let hits = (0..1000)
            .filter(|_| FaultPlan::sample(&spec, &mut draw).error_status == Some(429))
            .count();
        assert!((200..=300).contains(&hits), "{hits}");
        assert_eq!(
            FaultPlan::sample(&FaultSpec::default(), || 0.0),
            FaultPlan::default()
        );
    }
}
