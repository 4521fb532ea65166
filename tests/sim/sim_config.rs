//! Configuration: TOML fields with units in their names, unknown fields rejected, flags override.

use clap::Parser;
use tokenmeter::sim::{SimArgs, SimConfig};

#[derive(Debug, Parser)]
struct Wrapper {
    #[command(flatten)]
    sim: SimArgs,
}

#[test]
fn toml_file_then_flags() {
    let dir = std::env::temp_dir().join(format!("tm-sim-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("sim.toml");
    std::fs::write(&path, "max_num_seqs = 16\nstep_base_ms = 10.0\ncold_start_ms = 18900.0\nserved_model_name = \"m\"\n").unwrap();
    let w = Wrapper::parse_from([
        "x",
        "--listen",
        "127.0.0.1:0",
        "--config",
        path.to_str().unwrap(),
        "--step-base-ms",
        "12.5",
        "--fixed-pace",
    ]);
    let c = w.sim.to_config().unwrap();
    assert_eq!(
        (
            c.max_num_seqs,
            c.step_base_ms,
            c.cold_start_ms,
            c.served_model_name.as_str()
        ),
        (16, 12.5, 18900.0, "m")
    );
    assert!(c.fixed_pace);
    assert_eq!(c.step_per_seq_ms, SimConfig::default().step_per_seq_ms);
    std::fs::write(&path, "max_num_seq = 16\n").unwrap();
    let w = Wrapper::parse_from(["x", "--config", path.to_str().unwrap()]);
    assert!(w.sim.to_config().is_err(), "unknown field must be rejected");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn invalid_values_are_rejected() {
    assert!(SimConfig {
        max_num_seqs: 0,
        ..SimConfig::default()
    }
    .validate()
    .is_err());
    assert!(SimConfig {
        stop_probability_per_token: 1.0,
        ..SimConfig::default()
    }
    .validate()
    .is_err());
    assert!(SimConfig {
        prefill_tok_s: 0.0,
        ..SimConfig::default()
    }
    .validate()
    .is_err());
    assert!(SimConfig::default().validate().is_ok());
}

#[test]
fn defaults_reproduce_the_benchmarked_box() {
    let c = SimConfig::default();
    let one = 1e9 / c.decode_step_ns(1) as f64;
    let sixteen = 16.0 * 1e9 / c.decode_step_ns(16) as f64;
    assert!((one - 69.9).abs() < 0.1, "{one}");
    assert!((sixteen - 349.3).abs() < 0.5, "{sixteen}");
}

#[test]
fn kv_cache_settings_from_file_and_flags() {
    let d = SimConfig::default();
    assert_eq!((d.num_gpu_blocks, d.block_size), (65_536, 16));
    assert_eq!(d.kv_cache_tokens(), 1_048_576);
    assert!(d.enable_prefix_caching, "on by default, as vLLM V1");
    assert!(!d.enable_prompt_tokens_details, "off by default, as vLLM");
    let w = Wrapper::parse_from([
        "x",
        "--num-gpu-blocks",
        "100",
        "--block-size",
        "32",
        "--no-enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--max-model-len",
        "3168",
    ]);
    let c = w.sim.to_config().unwrap();
    assert_eq!(
        (c.num_gpu_blocks, c.block_size, c.kv_cache_tokens()),
        (100, 32, 3200)
    );
    assert!(!c.enable_prefix_caching && c.enable_prompt_tokens_details);
    // One request of max_model_len tokens must fit the usable blocks, as vLLM checks at start.
    let too_long = Wrapper::parse_from(["x", "--num-gpu-blocks", "100", "--max-model-len", "1585"]);
    assert!(too_long.sim.to_config().is_err());
    assert!(SimConfig {
        block_size: 0,
        ..SimConfig::default()
    }
    .validate()
    .is_err());
}
