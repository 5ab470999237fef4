import SecretServiceCommand

secretServiceMain()
