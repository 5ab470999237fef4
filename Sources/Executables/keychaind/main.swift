import Keychaind

keychaindMain()
