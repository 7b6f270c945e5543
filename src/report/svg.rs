//! Inline SVG charts for the HTML report, drawn here so the report needs no script and no network:
//! line / scatter charts with axes, ticks and a legend, and box plots.

use std::fmt::Write as _;

const W: f64 = 640.0;
const H: f64 = 360.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 36.0;
const BOTTOM: f64 = 50.0;

/// Colours per target, in config order (colour-blind-safe Okabe–Ito).
pub const PALETTE: [&str; 6] = [
    "#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9",
];

pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// One line or set of points.
pub struct Series {
    pub name: String,
    pub color: &'static str,
    pub points: Vec<(f64, f64)>,
    /// A label next to each point (e.g. the concurrency on a Pareto chart).
    pub point_labels: Vec<String>,
    pub dashed: bool,
    pub line: bool,
    pub markers: bool,
}

impl Series {
    pub fn new(name: impl Into<String>, color: &'static str, points: Vec<(f64, f64)>) -> Series {
        Series {
            name: name.into(),
            color,
            points,
            point_labels: Vec::new(),
            dashed: false,
            line: true,
            markers: true,
        }
    }
}

pub struct LineChart {
    pub id: &'static str,
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    /// A log2 x axis with a tick at every x value (concurrency levels).
    pub x_log2: bool,
    pub series: Vec<Series>,
}

/// 1, 2 or 5 times a power of ten, about `span / 5`.
fn nice_step(span: f64) -> f64 {
    if span <= 0.0 || !span.is_finite() {
        return 1.0;
    }
    let raw = span / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let m = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    m * mag
}

fn fmt_tick(v: f64) -> String {
    if v.abs() >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// A linear scale from a data range onto pixels.
struct Scale {
    lo: f64,
    hi: f64,
    px0: f64,
    px1: f64,
}

impl Scale {
    fn at(&self, v: f64) -> f64 {
        let span = (self.hi - self.lo).max(1e-12);
        self.px0 + (v - self.lo) / span * (self.px1 - self.px0)
    }
}

fn open(out: &mut String, id: &str, title: &str) {
    let _ = write!(
        out,
        r##"<svg class="chart" id="{id}" xmlns="http://www.w3.org/2000/svg" role="img" viewBox="0 0 {W} {H}" width="{W}" height="{H}"><title>{t}</title><rect width="{W}" height="{H}" fill="#fff"/><text x="{x}" y="22" class="chart-title" text-anchor="middle">{t}</text>"##,
        t = esc(title),
        x = W / 2.0
    );
}

/// Y axis from 0 to a nice value above `max`, with grid lines; returns the scale.
fn y_axis(out: &mut String, max: f64, label: &str) -> Scale {
    let step = nice_step(max.max(1e-9));
    let top = (max / step).ceil().max(1.0) * step;
    let y = Scale {
        lo: 0.0,
        hi: top,
        px0: H - BOTTOM,
        px1: TOP,
    };
    let mut v = 0.0;
    while v <= top + step / 2.0 {
        let py = y.at(v);
        let _ = write!(
            out,
            r##"<line x1="{LEFT}" x2="{}" y1="{py:.1}" y2="{py:.1}" stroke="#e5e5e5"/><text x="{}" y="{:.1}" text-anchor="end" class="tick">{}</text>"##,
            W - RIGHT,
            LEFT - 6.0,
            py + 4.0,
            fmt_tick(v)
        );
        v += step;
    }
    let _ = write!(
        out,
        r#"<text transform="translate(16,{:.1}) rotate(-90)" text-anchor="middle" class="axis-label">{}</text>"#,
        (TOP + H - BOTTOM) / 2.0,
        esc(label)
    );
    y
}

fn x_label(out: &mut String, label: &str) {
    let _ = write!(
        out,
        r##"<line x1="{LEFT}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#333"/><line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{y:.1}" stroke="#333"/><text x="{:.1}" y="{}" text-anchor="middle" class="axis-label">{}</text>"##,
        W - RIGHT,
        (LEFT + W - RIGHT) / 2.0,
        H - 10.0,
        esc(label),
        y = H - BOTTOM
    );
}

/// How a legend entry is drawn.
#[derive(Clone, Copy, PartialEq)]
enum Key {
    Line,
    Dashed,
    Marker,
}

fn legend(out: &mut String, entries: &[(&str, &str, Key)]) {
    for (i, (name, color, key)) in entries.iter().enumerate() {
        let y = TOP + 8.0 + i as f64 * 16.0;
        let x = W - RIGHT - 190.0;
        let _ = match key {
            Key::Marker => write!(
                out,
                r#"<circle cx="{}" cy="{y}" r="3.5" fill="{color}"/>"#,
                x + 11.0
            ),
            Key::Line | Key::Dashed => write!(
                out,
                r#"<line x1="{x}" x2="{}" y1="{y}" y2="{y}" stroke="{color}" stroke-width="2"{}/>"#,
                x + 22.0,
                if *key == Key::Dashed {
                    r#" stroke-dasharray="5 3""#
                } else {
                    ""
                }
            ),
        };
        let _ = write!(
            out,
            r#"<text x="{}" y="{}" class="legend">{}</text>"#,
            x + 28.0,
            y + 4.0,
            esc(name)
        );
    }
}

impl LineChart {
    /// Draws the legend; returns the area it takes.
    fn legend(&self, out: &mut String) -> Rect {
        let entries: Vec<(&str, &str, Key)> = self
            .series
            .iter()
            .map(|s| {
                let key = match (s.line, s.dashed) {
                    (false, _) => Key::Marker,
                    (true, true) => Key::Dashed,
                    (true, false) => Key::Line,
                };
                (s.name.as_str(), s.color, key)
            })
            .collect();
        legend(out, &entries);
        Rect {
            x0: W - RIGHT - 190.0,
            y0: TOP,
            x1: W - RIGHT,
            y1: TOP + 8.0 + entries.len() as f64 * 16.0,
        }
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        open(&mut out, self.id, &self.title);
        let pts: Vec<(f64, f64)> = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().copied())
            .filter(|(x, y)| x.is_finite() && y.is_finite() && (!self.x_log2 || *x > 0.0))
            .collect();
        let tx = |x: f64| if self.x_log2 { x.log2() } else { x };
        let y_max = pts.iter().map(|p| p.1).fold(0.0, f64::max);
        let y = y_axis(&mut out, y_max, &self.y_label);
        let (x_lo, x_hi) = pts.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |a, p| {
            (a.0.min(tx(p.0)), a.1.max(tx(p.0)))
        });
        let (x_lo, x_hi) = if pts.is_empty() {
            (0.0, 1.0)
        } else if self.x_log2 {
            (x_lo, x_hi.max(x_lo + 1.0))
        } else {
            // Linear axes start at 0 (throughput, ratios) so distances read as proportions.
            let step = nice_step(x_hi.max(1e-9));
            (0.0_f64.min(x_lo), (x_hi / step).ceil().max(1.0) * step)
        };
        let x = Scale {
            lo: x_lo,
            hi: x_hi,
            px0: LEFT + 10.0,
            px1: W - RIGHT - 10.0,
        };
        let ticks: Vec<f64> = if self.x_log2 {
            let mut t: Vec<f64> = pts.iter().map(|p| p.0).collect();
            t.sort_by(f64::total_cmp);
            t.dedup();
            t
        } else {
            let step = nice_step(x_hi - x_lo);
            (0..=((x_hi - x_lo) / step).round() as usize)
                .map(|i| x_lo + i as f64 * step)
                .collect()
        };
        for t in ticks {
            let px = x.at(tx(t));
            let _ = write!(
                out,
                r#"<text x="{px:.1}" y="{}" text-anchor="middle" class="tick">{}</text>"#,
                H - BOTTOM + 16.0,
                fmt_tick(t)
            );
        }
        x_label(&mut out, &self.x_label);
        // Point labels are placed once every point is known, so none covers another.
        let mut markers = Vec::new();
        let mut labels = Vec::new();
        for s in &self.series {
            let p: Vec<(f64, f64, usize)> = s
                .points
                .iter()
                .enumerate()
                .filter(|(_, (px, py))| {
                    px.is_finite() && py.is_finite() && (!self.x_log2 || *px > 0.0)
                })
                .map(|(i, (px, py))| (x.at(tx(*px)), y.at(*py), i))
                .collect();
            if s.line && p.len() > 1 {
                let d: Vec<String> = p
                    .iter()
                    .enumerate()
                    .map(|(i, (a, b, _))| {
                        format!("{}{a:.1},{b:.1}", if i == 0 { 'M' } else { 'L' })
                    })
                    .collect();
                let dash = if s.dashed {
                    r#" stroke-dasharray="5 3""#
                } else {
                    ""
                };
                let _ = write!(
                    out,
                    r#"<path class="series" d="{}" fill="none" stroke="{}" stroke-width="2"{dash}/>"#,
                    d.join(" "),
                    s.color
                );
            }
            if s.markers {
                for (a, b, i) in &p {
                    let _ = write!(
                        out,
                        r#"<circle class="point" cx="{a:.1}" cy="{b:.1}" r="3.5" fill="{}"/>"#,
                        s.color
                    );
                    markers.push((*a, *b));
                    if let Some(l) = s.point_labels.get(*i) {
                        labels.push((*a, *b, l.as_str()));
                    }
                }
            }
        }
        let legend_box = self.legend(&mut out);
        point_labels(&mut out, &markers, &labels, legend_box);
        if pts.is_empty() {
            no_data(&mut out);
        }
        out.push_str("</svg>");
        out
    }
}

/// A rectangle in pixels, `x0 ≤ x1`, `y0 ≤ y1`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Rect {
    x0: f64,
    y0: f64,
    x1: f64,
    y1: f64,
}

impl Rect {
    fn overlaps(&self, o: &Rect) -> bool {
        self.x0 < o.x1 && o.x0 < self.x1 && self.y0 < o.y1 && o.y0 < self.y1
    }

    fn within(&self, o: &Rect) -> bool {
        self.x0 >= o.x0 && self.x1 <= o.x1 && self.y0 >= o.y0 && self.y1 <= o.y1
    }
}

/// A `.point-label` (10 px) is about this wide a character, and reaches this far above and below
/// its baseline; the estimate errs wide so that the boxes hold what a browser draws.
const LABEL_CHAR_W: f64 = 6.2;
const LABEL_ASCENT: f64 = 9.0;
const LABEL_DESCENT: f64 = 3.0;
/// How far from its point a label sits, and the step between the rows tried above and below.
const LABEL_GAP: f64 = 5.0;
const LABEL_ROW: f64 = 12.0;
/// Rows tried on each side before a label settles for its first place.
const LABEL_ROWS: usize = 12;

/// The box of a label of `chars` characters starting at `x` with its baseline at `y`.
fn label_box(x: f64, y: f64, chars: usize) -> Rect {
    Rect {
        x0: x - 1.0,
        y0: y - LABEL_ASCENT,
        x1: x + chars as f64 * LABEL_CHAR_W + 1.0,
        y1: y + LABEL_DESCENT,
    }
}

/// Where each label (its point and text) goes, as its text's start and baseline: beside its
/// point (right and above, right and below, then on the left), else a row further above or below,
/// the first place that covers no label placed before it, no point, nothing of `avoid` and stays
/// in the plot area. Points close together (the low concurrencies of a Pareto chart, where
/// throughput and TTFT barely differ) would otherwise print their labels over each other.
fn place_labels(
    markers: &[(f64, f64)],
    labels: &[(f64, f64, &str)],
    avoid: Rect,
) -> Vec<(f64, f64)> {
    let area = Rect {
        x0: LEFT,
        y0: TOP,
        x1: W - RIGHT,
        y1: H - BOTTOM,
    };
    let dots: Vec<Rect> = markers
        .iter()
        .map(|&(x, y)| Rect {
            x0: x - 4.0,
            y0: y - 4.0,
            x1: x + 4.0,
            y1: y + 4.0,
        })
        .collect();
    let mut placed: Vec<Rect> = Vec::new();
    let mut out = Vec::new();
    for &(px, py, text) in labels {
        let chars = text.chars().count();
        let width = chars as f64 * LABEL_CHAR_W;
        let (right, left) = (px + LABEL_GAP + 1.0, px - LABEL_GAP - 1.0 - width);
        let (above, below) = (py - LABEL_GAP, py + LABEL_GAP + LABEL_ASCENT);
        let candidates = (0..=LABEL_ROWS).flat_map(|row| {
            let shift = row as f64 * LABEL_ROW;
            [
                (right, above - shift),
                (right, below + shift),
                (left, above - shift),
                (left, below + shift),
            ]
        });
        let free = |&(x, y): &(f64, f64)| {
            let b = label_box(x, y, chars);
            b.within(&area)
                && !b.overlaps(&avoid)
                && !placed.iter().chain(&dots).any(|o| b.overlaps(o))
        };
        let at = candidates
            .clone()
            .find(free)
            .or_else(|| {
                candidates
                    .clone()
                    .find(|&(x, y)| label_box(x, y, chars).within(&area))
            })
            .unwrap_or((right, above));
        placed.push(label_box(at.0, at.1, chars));
        out.push(at);
    }
    out
}

/// Writes the point labels where [`place_labels`] puts them; one moved away from its point gets
/// a thin line back to it.
fn point_labels(
    out: &mut String,
    markers: &[(f64, f64)],
    labels: &[(f64, f64, &str)],
    avoid: Rect,
) {
    for (&(px, py, text), (x, y)) in labels.iter().zip(place_labels(markers, labels, avoid)) {
        let b = label_box(x, y, text.chars().count());
        let (nx, ny) = (px.clamp(b.x0, b.x1), py.clamp(b.y0, b.y1));
        if (nx - px).hypot(ny - py) > LABEL_GAP + LABEL_ASCENT + 2.0 {
            let _ = write!(
                out,
                r##"<line class="label-leader" x1="{px:.1}" y1="{py:.1}" x2="{nx:.1}" y2="{ny:.1}" stroke="#999" stroke-width="0.75"/>"##
            );
        }
        let _ = write!(
            out,
            r#"<text x="{x:.1}" y="{y:.1}" class="point-label">{}</text>"#,
            esc(text)
        );
    }
}

fn no_data(out: &mut String) {
    let _ = write!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle" class="no-data">no data</text>"#,
        W / 2.0,
        H / 2.0
    );
}

/// One box: whiskers at p1 and p99, the box from the first to the third quartile, the median.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BoxStat {
    pub p1: f64,
    pub q1: f64,
    pub median: f64,
    pub q3: f64,
    pub p99: f64,
}

impl BoxStat {
    /// From samples (any order); `None` when empty.
    pub fn of(samples: &[f64]) -> Option<BoxStat> {
        let mut v: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        // Nearest rank, the definition the HDR histograms use too.
        let q = |p: f64| v[((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        Some(BoxStat {
            p1: q(0.01),
            q1: q(0.25),
            median: q(0.5),
            q3: q(0.75),
            p99: q(0.99),
        })
    }
}

pub struct BoxGroup {
    pub label: String,
    /// (series name, colour, box) per target.
    pub boxes: Vec<(String, &'static str, BoxStat)>,
}

pub struct BoxChart {
    pub id: &'static str,
    pub title: String,
    pub y_label: String,
    pub groups: Vec<BoxGroup>,
}

impl BoxChart {
    pub fn render(&self) -> String {
        let mut out = String::new();
        open(&mut out, self.id, &self.title);
        let max = self
            .groups
            .iter()
            .flat_map(|g| g.boxes.iter().map(|b| b.2.p99))
            .fold(0.0, f64::max);
        let y = y_axis(&mut out, max, &self.y_label);
        x_label(
            &mut out,
            "distribution (whiskers p1–p99, box quartiles, line median)",
        );
        let n = self.groups.len().max(1) as f64;
        let slot = (W - LEFT - RIGHT) / n;
        let mut legend_entries: Vec<(&str, &str, Key)> = Vec::new();
        for (gi, g) in self.groups.iter().enumerate() {
            let x0 = LEFT + gi as f64 * slot;
            let _ = write!(
                out,
                r#"<text x="{:.1}" y="{}" text-anchor="middle" class="tick">{}</text>"#,
                x0 + slot / 2.0,
                H - BOTTOM + 16.0,
                esc(&g.label)
            );
            let k = g.boxes.len().max(1) as f64;
            let bw = (slot * 0.7 / k).min(60.0);
            for (bi, (name, color, b)) in g.boxes.iter().enumerate() {
                if !legend_entries.iter().any(|e| e.0 == name) {
                    legend_entries.push((name, color, Key::Line));
                }
                let cx = x0 + slot * 0.15 + bw * (bi as f64 + 0.5);
                let (l, r) = (cx - bw * 0.4, cx + bw * 0.4);
                let _ = write!(
                    out,
                    r#"<g class="box" stroke="{color}"><line x1="{cx:.1}" x2="{cx:.1}" y1="{:.1}" y2="{:.1}"/><line x1="{cx:.1}" x2="{cx:.1}" y1="{:.1}" y2="{:.1}"/><line x1="{:.1}" x2="{:.1}" y1="{p1:.1}" y2="{p1:.1}"/><line x1="{:.1}" x2="{:.1}" y1="{p99:.1}" y2="{p99:.1}"/><rect x="{l:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{color}" fill-opacity="0.25"/><line x1="{l:.1}" x2="{r:.1}" y1="{m:.1}" y2="{m:.1}" stroke-width="2"/></g>"#,
                    y.at(b.p1),
                    y.at(b.q1),
                    y.at(b.q3),
                    y.at(b.p99),
                    cx - bw * 0.2,
                    cx + bw * 0.2,
                    cx - bw * 0.2,
                    cx + bw * 0.2,
                    y.at(b.q3),
                    r - l,
                    (y.at(b.q1) - y.at(b.q3)).max(1.0),
                    p1 = y.at(b.p1),
                    p99 = y.at(b.p99),
                    m = y.at(b.median),
                );
            }
        }
        legend(&mut out, &legend_entries);
        if max <= 0.0 {
            no_data(&mut out);
        }
        out.push_str("</svg>");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_steps_are_one_two_or_five_times_a_power_of_ten() {
        assert_eq!(nice_step(100.0), 20.0);
        assert_eq!(nice_step(7.0), 2.0);
        assert_eq!(nice_step(0.3), 0.1);
        assert_eq!(nice_step(2400.0), 500.0);
    }

    #[test]
    fn quartiles_by_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let b = BoxStat::of(&v).unwrap();
        assert_eq!(
            (b.p1, b.q1, b.median, b.q3, b.p99),
            (1.0, 25.0, 50.0, 75.0, 99.0)
        );
        assert!(BoxStat::of(&[]).is_none());
    }

    #[test]
    fn labels_of_points_close_together_do_not_overlap() {
        // A Pareto chart's low concurrencies: two targets, seven levels within a few pixels.
        let markers: Vec<(f64, f64)> = (0..7)
            .flat_map(|i| {
                let x = LEFT + 20.0 + f64::from(i) * 2.0;
                [(x, 250.0 - f64::from(i)), (x + 1.0, 252.0)]
            })
            .collect();
        let names: Vec<String> = (0..14).map(|i| format!("c={}", 1 << (i / 2))).collect();
        let labels: Vec<(f64, f64, &str)> = markers
            .iter()
            .zip(&names)
            .map(|(&(x, y), n)| (x, y, n.as_str()))
            .collect();
        let legend = Rect {
            x0: W - RIGHT - 190.0,
            y0: TOP,
            x1: W - RIGHT,
            y1: TOP + 40.0,
        };
        let at = place_labels(&markers, &labels, legend);
        let boxes: Vec<Rect> = at
            .iter()
            .zip(&labels)
            .map(|(&(x, y), l)| label_box(x, y, l.2.len()))
            .collect();
        for (i, a) in boxes.iter().enumerate() {
            assert!(
                a.x0 >= LEFT && a.y0 >= TOP && a.y1 <= H - BOTTOM,
                "{i}: {a:?}"
            );
            for (j, b) in boxes.iter().enumerate().skip(i + 1) {
                assert!(!a.overlaps(b), "labels {i} and {j} overlap: {a:?} {b:?}");
            }
            for (k, &(x, y)) in markers.iter().enumerate() {
                let dot = Rect {
                    x0: x - 3.5,
                    y0: y - 3.5,
                    x1: x + 3.5,
                    y1: y + 3.5,
                };
                assert!(!a.overlaps(&dot), "label {i} covers point {k}");
            }
        }
        // A lone point keeps its label right beside it, above and to the right.
        let lone = place_labels(&[(300.0, 200.0)], &[(300.0, 200.0, "c=1")], legend);
        assert_eq!(lone, [(306.0, 195.0)]);
    }

    #[test]
    fn a_chart_has_a_path_per_series_and_a_point_per_value() {
        let mut s = Series::new("aggregated", PALETTE[0], vec![(1.0, 10.0), (4.0, 30.0)]);
        s.point_labels = vec!["c=1".into(), "c=4".into()];
        let svg = LineChart {
            id: "c",
            title: "T <1>".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            x_log2: true,
            series: vec![s],
        }
        .render();
        assert!(svg.starts_with("<svg class=\"chart\" id=\"c\""));
        assert!(svg.ends_with("</svg>"));
        assert_eq!(svg.matches("<path class=\"series\"").count(), 1);
        assert_eq!(svg.matches("<circle class=\"point\"").count(), 2);
        assert!(svg.contains("T &lt;1&gt;") && svg.contains(">c=4<"));
        assert!(!svg.contains("NaN"));
    }
}
