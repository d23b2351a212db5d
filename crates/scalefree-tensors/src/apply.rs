//! The parameter server's update, one pass over memory: `param += alpha * Σ grads`.

/// `param[i] += alpha * (g_0[i] + ... + g_k[i])` for f32, in one pass (the server of a
/// parameter server is memory-bound: reading the parameter and every gradient once, writing
/// the parameter once).
pub fn sgd_apply_f32(param: &mut [f32], grads: &[&[f32]], alpha: f32) {
    for g in grads {
        assert_eq!(g.len(), param.len(), "a gradient's length differs from its parameter's");
    }
    const CHUNK: usize = 4096;
    let n = param.len();
    let mut lo = 0;
    while lo < n {
        let hi = (lo + CHUNK).min(n);
        let p = &mut param[lo..hi];
        match grads {
            [] => {}
            [a] => p.iter_mut().zip(&a[lo..hi]).for_each(|(x, &g)| *x += alpha * g),
            [a, b] => p.iter_mut().zip(&a[lo..hi]).zip(&b[lo..hi]).for_each(|((x, &g), &h)| *x += alpha * (g + h)),
            _ => {
                let mut acc = [0f32; CHUNK];
                let acc = &mut acc[..hi - lo];
                acc.copy_from_slice(&grads[0][lo..hi]);
                for g in &grads[1..] {
                    acc.iter_mut().zip(&g[lo..hi]).for_each(|(a, &v)| *a += v);
                }
                p.iter_mut().zip(acc.iter()).for_each(|(x, &a)| *x += alpha * a);
            }
        }
        lo = hi;
    }
}

/// `dst[i] = src[i] + alpha * Σ grads[i]`: the update written into another buffer (the
/// next version of a double-buffered parameter), one pass.
pub fn sgd_apply_to_f32(dst: &mut [f32], src: &[f32], grads: &[&[f32]], alpha: f32) {
    assert_eq!(dst.len(), src.len(), "source and destination differ in length");
    for g in grads {
        assert_eq!(g.len(), src.len(), "a gradient's length differs from its parameter's");
    }
    const CHUNK: usize = 4096;
    let n = dst.len();
    let mut lo = 0;
    while lo < n {
        let hi = (lo + CHUNK).min(n);
        let (d, s) = (&mut dst[lo..hi], &src[lo..hi]);
        match grads {
            [] => d.copy_from_slice(s),
            [a] => d.iter_mut().zip(s).zip(&a[lo..hi]).for_each(|((x, &p), &g)| *x = p + alpha * g),
            [a, b] => d
                .iter_mut()
                .zip(s)
                .zip(&a[lo..hi])
                .zip(&b[lo..hi])
                .for_each(|(((x, &p), &g), &h)| *x = p + alpha * (g + h)),
            _ => {
                d.copy_from_slice(&grads[0][lo..hi]);
                for g in &grads[1..] {
                    d.iter_mut().zip(&g[lo..hi]).for_each(|(a, &v)| *a += v);
                }
                d.iter_mut().zip(s).for_each(|(x, &p)| *x = p + alpha * *x);
            }
        }
        lo = hi;
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn matches_reference() {
        for k in 0..5 {
            let n = 10_007;
            let grads: Vec<Vec<f32>> = (0..k).map(|j| (0..n).map(|i| ((i * 7 + j * 3) % 13) as f32 - 6.0).collect()).collect();
            let mut p: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
            let want: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 + -0.1 * grads.iter().map(|g| g[i]).sum::<f32>()).collect();
            let refs: Vec<&[f32]> = grads.iter().map(|g| g.as_slice()).collect();
            let mut q = vec![0f32; n];
            super::sgd_apply_to_f32(&mut q, &p, &refs, -0.1);
            super::sgd_apply_f32(&mut p, &refs, -0.1);
            assert_eq!(p, q);
            for (a, b) in p.iter().zip(&want) {
                assert!((a - b).abs() <= 1e-4 * b.abs().max(1.0), "{k}: {a} vs {b}");
            }
        }
    }
}
