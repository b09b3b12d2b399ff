from dmq.client.cli import main

main()
