//! Compiles `proto/nightshift/v1/expert.proto` with protox (pure Rust, no system protoc) and
//! generates the prost messages and tonic client/server.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/nightshift/v1/expert.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
