//! Ranking metrics of top-k predictions against true label sets, as the Extreme
//! Classification Repository defines them: precision@k = |top k ∩ truth| / k (a point with
//! fewer than k predictions counts the missing ones as wrong) and nDCG@k = DCG@k / IDCG@k with
//! gains 1 / log2(rank + 1) and the ideal over min(k, |truth|) labels (0 for a point without
//! labels). Both are averaged over points.

/// Sums over points of precision and nDCG at 1..=max_k.
#[derive(Clone, Debug, PartialEq)]
pub struct RankingMetrics {
    pub max_k: usize,
    pub points: u64,
    precision_sum: Vec<f64>,
    ndcg_sum: Vec<f64>,
}

impl RankingMetrics {
    /// Empty sums for k = 1..=max_k.
    pub fn new(max_k: usize) -> RankingMetrics {
        RankingMetrics { max_k, points: 0, precision_sum: vec![0.; max_k], ndcg_sum: vec![0.; max_k] }
    }

    /// Adds a point: its predictions best first (`u32::MAX` = none) and its true labels.
    pub fn add(&mut self, predicted: &[u32], truth: &[u32]) {
        self.points += 1;
        let mut hits = 0usize;
        let mut dcg = 0f64;
        let mut idcg = 0f64;
        for k in 0..self.max_k {
            let gain = 1. / ((k + 2) as f64).log2();
            if predicted.get(k).is_some_and(|&l| l != u32::MAX && truth.contains(&l)) {
                hits += 1;
                dcg += gain;
            }
            if k < truth.len() {
                idcg += gain;
            }
            self.precision_sum[k] += hits as f64 / (k + 1) as f64;
            if idcg > 0. {
                self.ndcg_sum[k] += dcg / idcg;
            }
        }
    }

    /// Mean precision@k (k from 1).
    pub fn precision(&self, k: usize) -> f64 {
        self.precision_sum[k - 1] / self.points.max(1) as f64
    }

    /// Mean nDCG@k (k from 1).
    pub fn ndcg(&self, k: usize) -> f64 {
        self.ndcg_sum[k - 1] / self.points.max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_computed() {
        let mut m = RankingMetrics::new(3);
        m.add(&[1, 2, 3], &[2]);
        m.add(&[5, u32::MAX, u32::MAX], &[5, 6]);
        assert!((m.precision(1) - 0.5).abs() < 1e-12);
        assert!((m.precision(3) - (1. / 3. + 1. / 3.) / 2.).abs() < 1e-12);
        let ndcg1 = (0. + 1.) / 2.;
        assert!((m.ndcg(1) - ndcg1).abs() < 1e-12);
        let g = |r: f64| 1. / (r + 1.).log2();
        let ndcg3 = (g(2.) / g(1.) + g(1.) / (g(1.) + g(2.))) / 2.;
        assert!((m.ndcg(3) - ndcg3).abs() < 1e-12);
    }
}
