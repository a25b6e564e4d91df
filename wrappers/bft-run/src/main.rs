fn main() {
    eprintln!("bft-run: not built yet");
    std::process::exit(1);
}
