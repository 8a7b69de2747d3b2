//! Writes every target's seeds into `DIR/TARGET/` (default `fuzz/corpus`), named by content.

use std::hash::{DefaultHasher, Hash, Hasher};

fn main() -> std::io::Result<()> {
    let dir = std::env::args().nth(1).unwrap_or_else(|| "fuzz/corpus".into());
    for (target, seeds) in toolgate_fuzz::seeds::all() {
        let d = std::path::Path::new(&dir).join(target);
        std::fs::create_dir_all(&d)?;
        for seed in seeds {
            // Inputs with a fresh sealed id differ every run; the name is the content's without it.
            let mut h = DefaultHasher::new();
            String::from_utf8_lossy(&seed).split("tg1.").next().hash(&mut h);
            std::fs::write(d.join(format!("seed-{:016x}", h.finish())), &seed)?;
        }
    }
    Ok(())
}
