fn main() {
    eprintln!("bftrainer: not built yet");
    std::process::exit(1);
}
