//! The per-request latency histograms: [`AtomicHistogram`], a classic histogram recorded with a
//! few atomic operations, and `LatencyFamily`, the family of one latency (TTFT, ITL, request
//! duration) with its own cached OpenMetrics encoder.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use bytes::Bytes;
use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::family::MetricConstructor;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::{Registry, Unit};

use crate::request::RequestLabels;

/// A classic histogram whose record path is a handful of atomic operations. prometheus-client's
/// own `Histogram` guards its buckets with a mutex that a scrape also takes; this one never
/// blocks, so recording a request cannot wait on a scrape. The bounds are shared by every series
/// of a family, so a series costs one counter per bucket.
#[derive(Debug, Clone)]
pub struct AtomicHistogram {
    cells: Arc<HistogramCells>,
}

#[derive(Debug)]
struct HistogramCells {
    bounds: Arc<[f64]>,
    /// Non-cumulative count per bucket; the last cell is the implicit `+Inf` bucket.
    counts: Box<[AtomicU64]>,
    sum_bits: AtomicU64,
}

impl AtomicHistogram {
    /// A histogram over `bounds` (finite, strictly increasing; `+Inf` is added implicitly).
    pub fn new(bounds: Arc<[f64]>) -> Self {
        let counts = (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect();
        Self {
            cells: Arc::new(HistogramCells {
                bounds,
                counts,
                sum_bits: AtomicU64::new(0f64.to_bits()),
            }),
        }
    }

    /// Records one observation.
    pub fn observe(&self, value: f64) {
        self.observe_n(value, 1);
    }

    /// Records `n` observations of `value` at once (a chunk of k tokens counts its per-token gap k
    /// times). Non-finite values are dropped: one NaN would poison `_sum` for the life of the series.
    pub fn observe_n(&self, value: f64, n: u64) {
        if !value.is_finite() || n == 0 {
            return;
        }
        // `le` semantics: the first bucket whose bound is >= value.
        let index = self.cells.bounds.partition_point(|bound| *bound < value);
        self.cells.counts[index].fetch_add(n, Ordering::Relaxed);
        let add = value * n as f64;
        // The closure always returns Some, so the update cannot fail.
        let _ = self
            .cells
            .sum_bits
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + add).to_bits())
            });
    }

    /// Observation count (the sum of all bucket counts, so it always equals the `+Inf` bucket).
    pub fn count(&self) -> u64 {
        self.cells
            .counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }

    /// Sum of all observations.
    pub fn sum(&self) -> f64 {
        f64::from_bits(self.cells.sum_bits.load(Ordering::Relaxed))
    }

    /// The finite bucket bounds.
    pub fn bounds(&self) -> &[f64] {
        &self.cells.bounds
    }
}

impl TypedMetric for AtomicHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for AtomicHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let mut buckets = Vec::with_capacity(self.cells.counts.len());
        let mut count = 0u64;
        for (i, cell) in self.cells.counts.iter().enumerate() {
            let n = cell.load(Ordering::Relaxed);
            count += n;
            let bound = self.cells.bounds.get(i).copied().unwrap_or(f64::INFINITY);
            buckets.push((bound, n));
        }
        encoder.encode_histogram::<NoLabelSet>(self.sum(), count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// Builds the histograms of one family over shared bounds.
#[derive(Debug, Clone)]
pub struct SharedBuckets(pub Arc<[f64]>);

impl MetricConstructor<AtomicHistogram> for SharedBuckets {
    fn new_metric(&self) -> AtomicHistogram {
        AtomicHistogram::new(self.0.clone())
    }
}

/// A per-request latency histogram family (TTFT, ITL, request duration) with its own text
/// encoder. These three families are ~95 % of the exposition (~127 lines per series, ~70 series
/// per family with two targets on the default plan), and between two scrapes only the series of
/// the step in progress change. So each series keeps its last rendered text with the count and
/// sum it was rendered from; a scrape re-renders only series whose count or sum moved and copies
/// the rest. The text is byte for byte what prometheus-client writes for the same histogram (the
/// header and `le` strings are taken from its own encoding at start-up; a unit test compares the
/// two), and no scrape serves stale values: the check is made against the live atomics.
#[derive(Debug)]
pub(super) struct LatencyFamily {
    /// The exposed name, `..._seconds`.
    name: String,
    bounds: Arc<[f64]>,
    /// `# HELP`, `# TYPE` and `# UNIT` lines.
    header: Bytes,
    /// The `le` value of each bound (`0.001`), `+Inf` last.
    les: Box<[Box<str>]>,
    series: RwLock<HashMap<RequestLabels, Arc<LatencySeries>>>,
}

#[derive(Debug)]
struct LatencySeries {
    histogram: AtomicHistogram,
    /// Only scrapes take this lock; recording never does.
    text: Mutex<SeriesText>,
}

#[derive(Debug, Default)]
struct SeriesText {
    /// `None` until the first render.
    rendered_from: Option<(u64, u64)>,
    /// Shared with the scrapes that serve it: a scrape hands this buffer to the socket as it is.
    text: Bytes,
}

impl LatencyFamily {
    /// `name` without the unit suffix, as registered (`llm_canary_time_to_first_token`).
    pub(super) fn new(name: &str, help: &str, bounds: Arc<[f64]>) -> Self {
        // prometheus-client's own rendering of an unlabelled histogram over the same bounds gives
        // the exact header and `le` text.
        let mut probe = Registry::default();
        probe.register_with_unit(
            name,
            help,
            Unit::Seconds,
            AtomicHistogram::new(bounds.clone()),
        );
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &probe)
            .expect("encoding into a String cannot fail");
        let mut header = String::new();
        let mut les = Vec::with_capacity(bounds.len() + 1);
        for line in text.lines() {
            if line.starts_with("# ") && line != "# EOF" {
                header.push_str(line);
                header.push('\n');
            } else if let Some((_, rest)) = line.split_once("{le=\"") {
                let end = rest.find("\"}").expect("a bucket line closes its labels");
                les.push(rest[..end].into());
            }
        }
        debug_assert_eq!(les.len(), bounds.len() + 1);
        Self {
            name: format!("{name}_seconds"),
            bounds,
            header: Bytes::from(header),
            les: les.into(),
            series: RwLock::new(HashMap::new()),
        }
    }

    pub(super) fn get(&self, labels: &RequestLabels) -> Option<AtomicHistogram> {
        let series = self.series.read().unwrap_or_else(PoisonError::into_inner);
        series.get(labels).map(|s| s.histogram.clone())
    }

    pub(super) fn get_or_create(&self, labels: &RequestLabels) -> AtomicHistogram {
        if let Some(histogram) = self.get(labels) {
            return histogram;
        }
        let mut series = self.series.write().unwrap_or_else(PoisonError::into_inner);
        series
            .entry(labels.clone())
            .or_insert_with(|| {
                Arc::new(LatencySeries {
                    histogram: AtomicHistogram::new(self.bounds.clone()),
                    text: Mutex::new(SeriesText::default()),
                })
            })
            .histogram
            .clone()
    }

    pub(super) fn remove(&self, labels: &RequestLabels) {
        let mut series = self.series.write().unwrap_or_else(PoisonError::into_inner);
        series.remove(labels);
    }

    /// Appends the family's text to `out`, a chunk per series, each shared with the series' kept
    /// rendering (no copy); nothing when it has no series (like prometheus-client).
    pub(super) fn encode(&self, out: &mut Vec<Bytes>) {
        // The series list is copied out so recording a new label set never waits on the encoder.
        let series: Vec<(RequestLabels, Arc<LatencySeries>)> = {
            let map = self.series.read().unwrap_or_else(PoisonError::into_inner);
            map.iter().map(|(l, s)| (l.clone(), s.clone())).collect()
        };
        if series.is_empty() {
            return;
        }
        out.push(self.header.clone());
        let mut counts = vec![0u64; self.les.len()];
        for (labels, s) in &series {
            let cells = &s.histogram.cells;
            for (slot, cell) in counts.iter_mut().zip(cells.counts.iter()) {
                *slot = cell.load(Ordering::Relaxed);
            }
            let count: u64 = counts.iter().sum();
            let sum_bits = cells.sum_bits.load(Ordering::Relaxed);
            let mut text = s.text.lock().unwrap_or_else(PoisonError::into_inner);
            if text.rendered_from != Some((count, sum_bits)) {
                let mut rendered = String::with_capacity(text.text.len());
                self.render(
                    labels,
                    &counts,
                    count,
                    f64::from_bits(sum_bits),
                    &mut rendered,
                );
                text.text = Bytes::from(rendered);
                text.rendered_from = Some((count, sum_bits));
            }
            out.push(text.text.clone());
        }
    }

    /// The `_sum`, `_count` and `_bucket` lines of one series, as prometheus-client writes them.
    fn render(
        &self,
        labels: &RequestLabels,
        counts: &[u64],
        count: u64,
        sum: f64,
        text: &mut String,
    ) {
        let label_text = escaped_pairs(labels);
        text.clear();
        let mut ints = itoa::Buffer::new();
        for (suffix, value) in [
            ("_sum", dtoa::Buffer::new().format(sum)),
            ("_count", ints.format(count)),
        ] {
            text.push_str(&self.name);
            text.push_str(suffix);
            text.push('{');
            text.push_str(&label_text);
            text.push_str("} ");
            text.push_str(value);
            text.push('\n');
        }
        // prometheus-client writes the `le` label ahead of the series' own labels.
        let mut line_head = String::with_capacity(self.name.len() + 16);
        line_head.push_str(&self.name);
        line_head.push_str("_bucket{le=\"");
        let mut line_labels = String::with_capacity(label_text.len() + 4);
        line_labels.push_str("\",");
        line_labels.push_str(&label_text);
        line_labels.push_str("} ");
        text.reserve(counts.len() * (line_head.len() + line_labels.len() + 20));
        let mut cumulative = 0u64;
        for (n, le) in counts.iter().zip(self.les.iter()) {
            cumulative += n;
            text.push_str(&line_head);
            text.push_str(le);
            text.push_str(&line_labels);
            text.push_str(ints.format(cumulative));
            text.push('\n');
        }
    }
}

/// `target="..",serving_mode="..",…` with OpenMetrics escaping, the empty labels left out, as
/// `RequestLabels`' own encoding writes them.
fn escaped_pairs(l: &RequestLabels) -> String {
    let mut text = String::with_capacity(160);
    for (key, value) in l.pairs().into_iter().filter(|(_, v)| !v.is_empty()) {
        if !text.is_empty() {
            text.push(',');
        }
        text.push_str(key);
        text.push_str("=\"");
        crate::promtext::escape_into(&mut text, value);
        text.push('"');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::family::Family;

    use crate::export::buckets::latency_buckets;
    use crate::export::testing::{agg, sample};

    #[test]
    fn latency_families_encode_like_prometheus_client() {
        let bounds: Arc<[f64]> = latency_buckets(&[2.0, 0.0333]).into();
        let odd = RequestLabels {
            target: "a\"b\\c\nd".to_owned(),
            prefix_ratio: "x\"y".to_owned(),
            ..agg("prefix_cache").with_concurrency(4)
        };
        let plain = agg("concurrency_sweep").with_concurrency(32);
        let ours = LatencyFamily::new("h", "help text", bounds.clone());
        let derived: Family<RequestLabels, AtomicHistogram, SharedBuckets> =
            Family::new_with_constructor(SharedBuckets(bounds));
        let mut registry = Registry::default();
        registry.register_with_unit("h", "help text", Unit::Seconds, derived.clone());
        let expected = |registry: &Registry| {
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, registry).expect("encode");
            text.trim_end_matches("# EOF\n").to_owned()
        };
        let ours_text = |family: &LatencyFamily| {
            let mut chunks = Vec::new();
            family.encode(&mut chunks);
            chunks
                .iter()
                .map(|c| std::str::from_utf8(c).unwrap())
                .collect::<String>()
        };
        assert_eq!(ours_text(&ours), "", "an empty family writes nothing");
        let observe = |labels: &RequestLabels, v: f64| {
            ours.get_or_create(labels).observe(v);
            derived.get_or_create_owned(labels).observe(v);
        };
        observe(&odd, 0.25);
        observe(&plain, 0.0333);
        observe(&plain, 500.0);
        let first = expected(&registry);
        assert!(first.contains(r#"target="a\"b\\c\nd""#), "{first}");
        let mut got = ours_text(&ours);
        // Series order is a HashMap's in both; compare line sets and the header.
        let sorted = |t: &str| {
            let mut lines: Vec<String> = t.lines().map(str::to_owned).collect();
            lines.sort();
            lines
        };
        assert_eq!(sorted(&got), sorted(&first));
        assert!(got.starts_with("# HELP h_seconds help text.\n# TYPE h_seconds histogram\n"));
        // Unchanged series come from the cache, changed ones are rendered again.
        assert_eq!(ours_text(&ours), got);
        observe(&plain, 0.05);
        got = ours_text(&ours);
        assert_eq!(sorted(&got), sorted(&expected(&registry)));
        ours.remove(&plain);
        derived.remove(&plain);
        assert_eq!(sorted(&ours_text(&ours)), sorted(&expected(&registry)));
    }

    #[test]
    fn histogram_observation_lands_in_le_bucket() {
        let h = AtomicHistogram::new(vec![1.0, 2.0].into());
        h.observe(1.0);
        h.observe(1.5);
        h.observe(5.0);
        h.observe_n(0.5, 3);
        h.observe(f64::NAN);
        assert_eq!(h.count(), 6);
        assert!((h.sum() - 9.0).abs() < 1e-12);
        let mut registry = Registry::default();
        registry.register("h", "help", h);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        assert_eq!(sample(&text, "h_bucket", &[("le", "1.0")]), Some(4.0));
        assert_eq!(sample(&text, "h_bucket", &[("le", "2.0")]), Some(5.0));
        assert_eq!(sample(&text, "h_bucket", &[("le", "+Inf")]), Some(6.0));
        assert_eq!(sample(&text, "h_count", &[]), Some(6.0));
    }
}
