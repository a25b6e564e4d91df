fn main() {
    eprintln!("bftrainerd: not built yet");
    std::process::exit(1);
}
