//! The device rungs parse, validate and have the geometry their comments name
//! (rung 2: the reference geometry 768x512x121, 6144 tokens).

use std::path::PathBuf;

use evidence::rung::{Device, Rung};

fn rung(n: u32) -> Rung {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("rungs")
        .join(format!("{n}.toml"));
    Rung::load(&p).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn device_rungs_have_the_reference_geometry() {
    let want = [
        (1, "ltxv-2b", 512, 320, 25, 20, false, (4, 10, 16)),
        (2, "ltxv-2b", 768, 512, 121, 30, true, (16, 16, 24)),
        (3, "ltxv-13b", 768, 512, 121, 30, true, (16, 16, 24)),
        (4, "ltxv-13b", 1216, 704, 121, 30, true, (16, 22, 38)),
    ];
    for (n, preset, w, h, f, steps, guided, grid) in want {
        let r = rung(n);
        assert_eq!(r.preset, preset, "rung {n}");
        assert_eq!(
            (r.width, r.height, r.frames, r.steps),
            (w, h, f, steps),
            "rung {n}"
        );
        assert_eq!(r.uses_guidance(), guided, "rung {n}");
        assert_eq!(r.device, Device::Cuda, "rung {n}");
        assert_eq!(r.latent_grid(), grid, "rung {n}");
    }
}
